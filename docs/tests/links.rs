//! The user-facing Markdown: every relative link points at a file that exists, and README
//! stays short enough to read in five minutes.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README, the guide, and the READMEs of the crates, examples and `deploy/`.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    for dir in ["docs", "connectors", "examples", "deploy", "fuzz"] {
        let dir = root.join(dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            } else if path.join("README.md").is_file() {
                pages.push(path.join("README.md"));
            }
        }
    }
    pages.sort();
    pages
}

/// The targets of `[text](target)` links in `text`.
fn links(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &text[i + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .collect()
}

#[test]
fn relative_links_point_at_files_that_exist() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let path = target.split('#').next().unwrap_or_default();
            let resolved = page.parent().unwrap().join(path);
            if !resolved.exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to nothing:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn readme_is_at_most_250_lines_of_at_most_100_characters() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() <= 250, "README.md has {} lines", lines.len());
    let long: Vec<String> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.chars().count() > 100)
        .map(|(i, l)| format!("line {}: {} characters", i + 1, l.chars().count()))
        .collect();
    assert!(
        long.is_empty(),
        "README.md lines over 100 characters:\n  {}",
        long.join("\n  ")
    );
}
