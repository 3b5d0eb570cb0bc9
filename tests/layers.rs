//! The house rules of the module graph, from docs/design.md "Module map and layers": every
//! `crate::` path of the library points to its own layer or a lower one, the top-level modules
//! import each other without cycles, and so do the files inside each directory module. Test code
//! (`#[cfg(test)]` modules and `tests.rs` files) may reach anywhere and is not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module name -> layer, from the design document's table (`| 3 | `lsm` |`).
fn layers(design: &str) -> BTreeMap<String, u32> {
    let section = design.split("## Module map and layers").nth(1).expect("docs/design.md has the layers section");
    let mut layers = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(layer) = cells.get(1).and_then(|cell| cell.parse::<u32>().ok()) else { continue };
        for module in cells[2].split(',') {
            layers.insert(module.trim().trim_matches('`').to_string(), layer);
        }
    }
    assert!(layers.len() > 10, "the layers table was not found: {layers:?}");
    layers
}

/// The library's source files: (path below `src/`, text without its test modules and comments).
fn library_sources(src: &Path) -> Vec<(Vec<String>, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "bin") {
                    dirs.push(path);
                }
                continue;
            }
            let relative: Vec<String> = path
                .strip_prefix(src)
                .unwrap()
                .with_extension("")
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let name = relative.last().unwrap().as_str();
            if path.extension().is_none_or(|ext| ext != "rs")
                || name == "tests"
                || (relative.len() == 1 && (name == "main" || name == "lib"))
            {
                continue;
            }
            files.push((relative, without_tests_and_comments(&std::fs::read_to_string(&path).unwrap())));
        }
    }
    files.sort();
    files
}

/// The text before a file's `#[cfg(test)] mod ... {` (test modules close every file here), with
/// line comments removed (they cite paths that are no imports).
fn without_tests_and_comments(text: &str) -> String {
    let mut kept = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let opens_test_module = line.trim() == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| next.trim_start().starts_with("mod ") && next.trim_end().ends_with('{'));
        if opens_test_module {
            break;
        }
        kept.push_str(line.split("//").next().unwrap_or(""));
        kept.push('\n');
    }
    kept
}

/// Every identifier that follows `prefix` in `text` (`crate::` gives `lsm` for `crate::lsm::tree`).
fn names_after<'t>(text: &'t str, prefix: &'t str) -> impl Iterator<Item = &'t str> + 't {
    text.match_indices(prefix).filter_map(move |(at, _)| {
        let boundary = text[..at].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let rest = &text[at + prefix.len()..];
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        (boundary && end > 0).then(|| &rest[..end])
    })
}

/// The modules in a cycle of `edges`, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|node| visit(node, edges, &mut done, &mut Vec::new()))
}

/// What the library's imports break: upward imports, unknown modules, cycles between top-level
/// modules and between the files of one directory module. Empty when the house is in order.
fn violations(files: &[(Vec<String>, String)], layers: &BTreeMap<String, u32>) -> Vec<String> {
    let mut found = Vec::new();
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut inner: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (path, text) in files {
        let module = &path[0];
        let Some(&layer) = layers.get(module) else {
            found.push(format!("src/{}.rs: module `{module}` is not in the layers table", path.join("/")));
            continue;
        };
        for target in names_after(text, "crate::").filter(|t| t != module) {
            match layers.get(target) {
                Some(&to) if to > layer => found.push(format!(
                    "src/{}.rs: `{module}` (layer {layer}) imports `{target}` (layer {to})",
                    path.join("/")
                )),
                None => found.push(format!("src/{}.rs: imports unknown module `{target}`", path.join("/"))),
                _ => {}
            }
            top.entry(module.clone()).or_default().insert(target.to_string());
        }
        if path.len() >= 2 && path[1] != "mod" {
            let siblings = inner.entry(module.clone()).or_default();
            let me = path[1].clone();
            let mut targets: BTreeSet<String> =
                names_after(text, &format!("crate::{module}::")).map(String::from).collect();
            if path.len() == 2 {
                targets.extend(names_after(text, "super::").map(String::from));
                targets.extend(super_lists(text));
            }
            targets.remove(&me);
            siblings.entry(me).or_default().extend(targets);
        }
    }
    if let Some(cycle) = find_cycle(&top) {
        found.push(format!("a cycle between top-level modules: {}", cycle.join(" -> ")));
    }
    for (module, edges) in &mut inner {
        // Only edges between files of the module count (not items of its `mod.rs`).
        let members: BTreeSet<String> = edges.keys().cloned().collect();
        edges.values_mut().for_each(|targets| targets.retain(|t| members.contains(t)));
        if let Some(cycle) = find_cycle(edges) {
            found.push(format!("a cycle between the files of `{module}`: {}", cycle.join(" -> ")));
        }
    }
    found
}

/// The names in `super::{a, b::c, ...}` lists (their first segments).
fn super_lists(text: &str) -> Vec<String> {
    text.match_indices("super::{")
        .filter_map(|(at, opener)| {
            let list = &text[at + opener.len()..];
            list.find('}').map(|end| &list[..end])
        })
        .flat_map(|list| list.split(',').map(|item| item.trim().split("::").next().unwrap_or("").to_string()))
        .filter(|name| !name.is_empty())
        .collect()
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_library_keeps_its_layers_and_has_no_cycles() {
    let design = std::fs::read_to_string(repository().join("docs/design.md")).unwrap();
    let files = library_sources(&repository().join("src"));
    assert!(files.len() > 50, "{} source files found", files.len());
    let problems = violations(&files, &layers(&design));
    assert!(problems.is_empty(), "the module graph breaks docs/design.md:\n{}", problems.join("\n"));
}

/// The checker itself finds what it guards against, on made-up files.
#[test]
fn upward_imports_unknown_modules_and_cycles_are_found() {
    let layers: BTreeMap<String, u32> =
        [("base", 0), ("lsm", 1), ("index", 2), ("query", 2)].map(|(m, l)| (m.to_string(), l)).into();
    let file = |path: &str, text: &str| {
        (path.split('/').map(String::from).collect::<Vec<_>>(), without_tests_and_comments(text))
    };
    let clean = [
        file("lsm/tree", "use crate::base::rng;\nuse super::run::Run;"),
        file("lsm/run", "use crate::lsm::entry::Entry; // crate::index in a comment"),
        file("index/mod", "use crate::lsm::tree::Tree;"),
        file("query", "use crate::index::Index;\n#[cfg(test)]\nmod tests {\n    use crate::index::Index;\n}"),
    ];
    assert_eq!(violations(&clean, &layers), Vec::<String>::new());
    let upward = [file("lsm/tree", "use crate::index::Index;")];
    assert_eq!(violations(&upward, &layers), ["src/lsm/tree.rs: `lsm` (layer 1) imports `index` (layer 2)"]);
    let unknown = [file("base/rng", "fn f() { crate::nowhere::g() }")];
    assert_eq!(violations(&unknown, &layers), ["src/base/rng.rs: imports unknown module `nowhere`"]);
    let same_layer_cycle = [file("index/mod", "use crate::query::x;"), file("query", "use crate::index::Index;")];
    assert_eq!(violations(&same_layer_cycle, &layers), ["a cycle between top-level modules: index -> query -> index"]);
    let file_cycle =
        [file("lsm/tree", "use super::{run::Run, entry};"), file("lsm/run", "use crate::lsm::tree::Tree;")];
    assert_eq!(violations(&file_cycle, &layers), ["a cycle between the files of `lsm`: run -> tree -> run"]);
}
