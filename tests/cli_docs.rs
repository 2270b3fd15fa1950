//! `uipoib completions` and `uipoib man`: the generated completion scripts are valid for
//! their shell and name the subcommands; the man pages are roff with the options.

use std::process::Command;

fn uipoib(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(args)
        .output()
        .expect("running uipoib");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn completions_for_each_shell_name_the_subcommands() {
    for (shell, mark) in [
        ("bash", "_uipoib()"),
        ("zsh", "#compdef uipoib"),
        ("fish", "complete -c uipoib"),
    ] {
        let (code, out, err) = uipoib(&["completions", shell]);
        assert_eq!(code, Some(0), "{shell}: {err}");
        assert!(out.contains(mark), "{shell}: no {mark:?}");
        for sub in ["up", "stats", "status", "compare", "poll-failure-policy"] {
            assert!(out.contains(sub), "{shell}: {sub} missing");
        }
    }
    // The bash script parses.
    let (_, script, _) = uipoib(&["completions", "bash"]);
    let dir = std::env::temp_dir().join(format!("uipoib-compl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("uipoib.bash");
    std::fs::write(&f, script).unwrap();
    let st = Command::new("bash").arg("-n").arg(&f).status().unwrap();
    assert!(st.success(), "bash -n refused the completion script");
    let (code, _, err) = uipoib(&["completions", "tcsh"]);
    assert_eq!(code, Some(2), "an unknown shell is a usage error: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn man_pages_for_the_command_and_every_subcommand() {
    let dir = std::env::temp_dir().join(format!("uipoib-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (code, out, err) = uipoib(&["man", dir.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    for page in [
        "uipoib.1",
        "uipoib-up.1",
        "uipoib-stats.1",
        "uipoib-fault-compare.1",
        "uipoib-fault-inject.1",
    ] {
        let p = dir.join(page);
        assert!(out.contains(p.to_str().unwrap()), "{page} not listed");
        let roff = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            roff.starts_with(".ie") || roff.contains(".TH"),
            "{page}: not roff"
        );
    }
    let up = std::fs::read_to_string(dir.join("uipoib-up.1")).unwrap();
    assert!(up.contains("poll\\-failure\\-policy") || up.contains("poll-failure-policy"));
    assert!(
        up.contains("uipoib up"),
        "the synopsis names the whole command"
    );
    // Without a directory: uipoib.1 on stdout.
    let (code, page, _) = uipoib(&["man"]);
    assert_eq!(code, Some(0));
    assert!(page.contains(".TH"), "{}", &page[..page.len().min(200)]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reader that stops early (`uipoib completions bash | head -1`) ends the command with
/// success and nothing on stderr, not a panic about a broken pipe. Here the reader is gone
/// before the first write, so every write fails with EPIPE.
#[test]
fn a_reader_that_closes_early_is_not_an_error() {
    for args in [&["completions", "bash"][..], &["man"][..]] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
            .args(args)
            .stdout(writer)
            .output()
            .expect("run uipoib");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{args:?}: {:?}, stderr: {stderr}",
            out.status
        );
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}
