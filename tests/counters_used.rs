//! Every counter and every drop reason declared in `src/iface/stats.rs` is moved somewhere in
//! the crate: a counter no code touches is a lie on the dashboard. The check reads the
//! sources, so it fails as soon as one is declared and nothing increments it.

use std::path::{Path, PathBuf};

use uipoib::iface::stats::DropReason;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate's sources except `stats.rs`, with `#[cfg(test)]` modules cut off (a counter
/// only a test touches is still never moved by the daemon).
fn crate_text() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    sources(&root, &mut files);
    let mut all = String::new();
    for f in files {
        if f.ends_with("stats.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let code = match text.find("#[cfg(test)]\nmod tests") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        all.push_str(code);
        all.push('\n');
    }
    all
}

/// The counter names of the `counters! { ... }` block.
fn counter_names() -> Vec<String> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/iface/stats.rs"))
            .unwrap();
    let start = text.find("\ncounters! {").expect("the counters! block");
    let body = &text[start + "\ncounters! {".len()..];
    let body = &body[..body.find("\n}").unwrap()];
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.is_empty())
        .map(|l| l.trim_end_matches(',').to_string())
        .collect()
}

#[test]
fn every_counter_is_moved_somewhere() {
    let code = crate_text();
    let names = counter_names();
    assert!(names.len() > 30, "parsed {names:?}");
    let unused: Vec<&String> = names
        .iter()
        .filter(|n| !code.contains(&format!(".{n})")) && !code.contains(&format!(".{n},")))
        .collect();
    assert!(
        unused.is_empty(),
        "counters declared in src/iface/stats.rs and never moved: {unused:?}"
    );
}

#[test]
fn every_drop_reason_is_counted_somewhere() {
    let code = crate_text();
    let unused: Vec<&str> = DropReason::ALL
        .iter()
        .map(|r| (r, format!("DropReason::{r:?}")))
        .filter(|(_, v)| !code.contains(v.as_str()))
        .map(|(r, _)| r.name())
        .collect();
    assert!(
        unused.is_empty(),
        "drop reasons declared and never counted: {unused:?}"
    );
}
