use triage::runtime::RuntimeConfig;
use triage_scenarios::{matrix, run_virtual, Consumer};

fn main() {
    for sc in matrix() {
        let mut line = format!("{:20}", sc.name);
        for cap in [1024usize, 512, 256, 128] {
            let mut c = RuntimeConfig::default();
            c.expert.queue.capacity = cap.try_into().unwrap();
            let out = run_virtual(&sc, &Consumer::Triage(Box::new(c)));
            line += &format!(
                " cap {cap}: {:.1}/{:.2}",
                100.0 * out.goodput.weighted(),
                100.0 * out.goodput.share(triage::Criticality::Critical)
            );
        }
        println!("{line}");
    }
}
