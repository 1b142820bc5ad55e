//! Names the source revision the binary is built from (SPEC 8.2/9: `--version` and
//! `materializer_build_info{revision}`): `MATERIALIZER_REVISION` when the build sets it (an image
//! built from a tarball), else the git commit of the work tree, else `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MATERIALIZER_REVISION");
    // A new commit moves the branch's ref (or packed-refs); a checkout moves HEAD.
    for path in [".git/HEAD", ".git/packed-refs"] {
        if Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            let path = format!(".git/{reference}");
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    let revision = std::env::var("MATERIALIZER_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(git_revision)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=MATERIALIZER_REVISION={revision}");
}

fn git_revision() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let revision = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    let revision: String = revision
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    (!revision.is_empty()).then_some(revision)
}
