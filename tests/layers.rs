//! The layers of the workspace, checked: each crate depends only downwards, the core does
//! no I/O, one tungstenite in the tree, and nothing in the repository cites a document
//! outside it. ARCHITECTURE.md states these rules; this binary is where they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// What each crate of the workspace may not depend on, directly or through others
/// (normal and build dependencies; dev-dependencies are the tests' business).
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "swarmtodo-proto",
        &[
            "automerge",
            "tokio",
            "rusqlite",
            "libsqlite3-sys",
            "tungstenite",
            "swarmtodo-core",
            "swarmtodo-store",
            "swarmtodo-client",
            "swarmtodo-hub",
            "swarmtodo-sim",
            "swarmtodo-cluster",
            "async-nats",
        ],
    ),
    (
        "swarmtodo-core",
        &[
            "tokio",
            "rusqlite",
            "libsqlite3-sys",
            "tungstenite",
            "swarmtodo-store",
            "swarmtodo-client",
            "swarmtodo-hub",
            "swarmtodo-sim",
            "swarmtodo-cluster",
            "async-nats",
        ],
    ),
    (
        "swarmtodo-store",
        &[
            "tungstenite",
            "swarmtodo-client",
            "swarmtodo-hub",
            "swarmtodo-sim",
            "swarmtodo-cluster",
            "async-nats",
        ],
    ),
    (
        "swarmtodo-cluster",
        &[
            "tungstenite",
            "swarmtodo-client",
            "swarmtodo-hub",
            "swarmtodo-sim",
        ],
    ),
    (
        "swarmtodo-client",
        &[
            "rusqlite",
            "libsqlite3-sys",
            "swarmtodo-store",
            "swarmtodo-hub",
            "swarmtodo-sim",
            "swarmtodo-cluster",
            "async-nats",
        ],
    ),
    ("swarmtodo-hub", &["swarmtodo-client", "swarmtodo-sim"]),
    ("swarmtodo-sim", &["swarmtodo"]),
];

/// Calls in the core's code (outside its tests) that would read a clock, draw a random
/// number or do I/O: the core takes time and randomness as arguments.
const CORE_FORBIDDEN_CALLS: &[&str] = &[
    "ActorId::random",
    "SystemTime::now",
    "Instant::now",
    "thread_rng",
    "rand::",
    "std::fs",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "std::thread",
    "std::process",
    "std::env",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cargo metadata` of the workspace.
fn metadata() -> Value {
    metadata_with(&[])
}

/// `cargo metadata` of the workspace, with more arguments (`--no-default-features`).
fn metadata_with(args: &[&str]) -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .args(args)
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON")
}

/// Package id → name, and package id → the ids it depends on (normal and build).
fn graph(meta: &Value) -> (BTreeMap<String, String>, BTreeMap<String, Vec<String>>) {
    let names = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut edges = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].as_str() != Some("dev"))
            })
            .map(|d| d["pkg"].as_str().unwrap().to_owned())
            .collect();
        edges.insert(node["id"].as_str().unwrap().to_owned(), deps);
    }
    (names, edges)
}

/// The names of every package `id` depends on, directly or not.
fn closure(
    id: &str,
    names: &BTreeMap<String, String>,
    edges: &BTreeMap<String, Vec<String>>,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![id.to_owned()];
    while let Some(next) = stack.pop() {
        for dep in edges.get(&next).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                stack.push(dep.clone());
            }
        }
    }
    seen.iter().map(|id| names[id].clone()).collect()
}

#[test]
fn crates_depend_only_downwards() {
    let meta = metadata();
    let (names, edges) = graph(&meta);
    let id_of = |name: &str| {
        names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| id.clone())
            .unwrap_or_else(|| panic!("no package {name} in the workspace"))
    };
    let mut broken = Vec::new();
    for (krate, forbidden) in FORBIDDEN {
        let deps = closure(&id_of(krate), &names, &edges);
        for f in *forbidden {
            if deps.contains(*f) {
                broken.push(format!("{krate} depends on {f}"));
            }
        }
    }
    assert!(broken.is_empty(), "layering broken: {broken:?}");
    // And the check is not empty: the core does build on automerge, the client on tokio.
    assert!(closure(&id_of("swarmtodo-core"), &names, &edges).contains("automerge"));
    assert!(closure(&id_of("swarmtodo-client"), &names, &edges).contains("tokio"));
    assert!(closure(&id_of("swarmtodo-cluster"), &names, &edges).contains("async-nats"));
}

/// Built without its default features (`--no-default-features`), the product has no
/// NATS in it: async-nats comes only with the `nats` feature.
#[test]
fn a_build_without_the_nats_feature_has_no_nats_client() {
    let (names, edges) = graph(&metadata_with(&["--no-default-features"]));
    let product = names
        .iter()
        .find(|(_, n)| n.as_str() == "swarmtodo")
        .map(|(id, _)| id.clone())
        .unwrap();
    let deps = closure(&product, &names, &edges);
    assert!(deps.contains("swarmtodo-cluster") && deps.contains("tokio"));
    assert!(
        !deps.contains("async-nats"),
        "async-nats without the nats feature"
    );
}

#[test]
fn one_version_of_each_heavy_dependency() {
    let meta = metadata();
    for heavy in [
        "tungstenite",
        "tokio",
        "automerge",
        "rusqlite",
        "libsqlite3-sys",
    ] {
        let versions: Vec<&str> = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"] == heavy)
            .map(|p| p["version"].as_str().unwrap())
            .collect();
        assert_eq!(versions.len(), 1, "{heavy}: versions {versions:?}");
    }
}

/// The Rust files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_core_reads_no_clock_draws_no_random_number_and_does_no_io() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/core/src"), &mut files);
    assert!(files.len() > 5, "the core's sources: {files:?}");
    let mut found = Vec::new();
    for file in &files {
        // A module's unit tests sit in its `tests.rs` (declared under `#[cfg(test)]`)
        // or at the end of its file, after `#[cfg(test)]`.
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or("");
            for call in CORE_FORBIDDEN_CALLS {
                if line.contains(call) {
                    found.push(format!("{}:{}: {call}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core must take these as inputs: {found:?}"
    );
}

/// The text files of the repository that a reader reads: sources, docs, schemas,
/// scenarios, scripts (not vendored code, build output or installed packages).
fn repository_texts(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | "vendor" | "node_modules" | ".git") {
                repository_texts(&path, out);
            }
        } else if ["rs", "md", "json", "toml", "mjs", "js", "sh", "yml"]
            .iter()
            .any(|e| name.ends_with(&format!(".{e}")))
            || name == "run"
        {
            out.push(path);
        }
    }
}

#[test]
fn nothing_cites_a_document_outside_the_repository() {
    let mut files = Vec::new();
    repository_texts(&root(), &mut files);
    assert!(files.len() > 50, "the repository's texts: {}", files.len());
    // Patterns built at run time, so that this file does not match itself.
    let outside = ["../", "shared/"].concat();
    let tracker = ["issue", " #"].concat();
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let bare_design = line.contains("DESIGN.md") && !line.contains("docs/DESIGN.md");
            let in_docs = file.starts_with(root().join("docs"));
            if line.contains(&outside)
                || line.to_lowercase().contains(&tracker)
                || (bare_design && !in_docs)
            {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "references outside the repository: {found:#?}"
    );
}
