//! Replays inputs through a target's body on stable, with each input's outcome and time: to
//! reproduce a crash libFuzzer found (`fuzz/artifacts/<target>/crash-...`) under a debugger or
//! with prints, or to see which inputs of a corpus are slow.
//!
//! ```text
//! cargo run -p triage-fuzz --example replay -- <target> <file or directory>...
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_default();
    let Some(&(_, run)) = triage_fuzz::TARGETS.iter().find(|(n, _)| *n == target) else {
        let names: Vec<&str> = triage_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!("usage: replay <target> <file or directory>...; targets: {names:?}");
        std::process::exit(2);
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for arg in args.map(PathBuf::from) {
        match std::fs::read_dir(&arg) {
            Ok(entries) => files.extend(entries.filter_map(|e| e.ok().map(|e| e.path()))),
            Err(_) => files.push(arg),
        }
    }
    files.sort();
    let (mut failed, mut total) = (0, Duration::ZERO);
    for file in &files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let started = Instant::now();
        let ok = std::panic::catch_unwind(|| run(&data)).is_ok();
        let took = started.elapsed();
        total += took;
        failed += usize::from(!ok);
        if !ok || took > Duration::from_millis(10) {
            println!(
                "{} {} {took:?}",
                if ok { "slow" } else { "FAIL" },
                file.display()
            );
        }
    }
    let mean = total / u32::try_from(files.len().max(1)).unwrap_or(u32::MAX);
    println!("{} inputs, {failed} failed, {mean:?} each", files.len());
    if failed > 0 {
        std::process::exit(1);
    }
}
