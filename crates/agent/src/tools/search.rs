//! Pi's search tools `find` (glob over file names, like `fd --glob`) and `grep` (like `rg --json`),
//! built on the crates ripgrep is made of: `ignore` walks the tree respecting `.gitignore` (also
//! outside a git repository, like `--no-require-git`) and including dotfiles (`--hidden`) but never
//! `.git/`, `globset` matches, `grep-regex`/`grep-searcher` search. Symlinks are not followed, so a
//! search never leaves the workspace. Results are sorted by path so that a transcript is reproducible.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use serde_json::{json, Map, Value};

use super::files::finish_listing;
use super::truncate::truncate_line;
use super::workspace::Workspace;
use super::{Tool, ToolError, ToolFuture, ToolOutput};

fn str_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn count_arg(args: &Value, key: &str) -> Option<usize> {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped to >= 0
    args.get(key).and_then(Value::as_f64).map(|n| n.max(0.0) as usize)
}

/// A walker over `root` with ripgrep's defaults as Pi runs them.
fn walker(root: &Path, overrides: Option<ignore::overrides::Override>) -> ignore::Walk {
    let mut b = ignore::WalkBuilder::new(root);
    b.hidden(false).require_git(false).follow_links(false).sort_by_file_name(std::cmp::Ord::cmp);
    b.filter_entry(|e| e.file_name() != ".git");
    if let Some(o) = overrides {
        b.overrides(o);
    }
    b.build()
}

fn relative(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).to_string_lossy().into_owned()
}

/// The search root of `path` (default the workspace), which must exist.
async fn search_root(ws: &Workspace, path: Option<&str>) -> Result<(PathBuf, String), ToolError> {
    let path = path.filter(|p| !p.is_empty()).unwrap_or(".").to_owned();
    let real = ws.resolve(&path).await?;
    if tokio::fs::metadata(&real).await.is_err() {
        return Err(ToolError::failed(format!("Path not found: {path}")));
    }
    Ok((real, path))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ToolError::failed(format!("search failed: {e}")))
}

/// `find {pattern, path?, limit?}`.
pub struct FindTool(pub Arc<Workspace>);

impl Tool for FindTool {
    fn read_only(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "find"
    }
    fn description(&self) -> &str {
        "Search for files by glob pattern. Returns matching file paths relative to the search directory. Respects .gitignore. Output is truncated to 1000 results or 50KB (whichever is hit first)."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {
            "pattern": {"type": "string", "description": "Glob pattern to match files, e.g. '*.ts', '**/*.json', or 'src/**/*.spec.ts'"},
            "path": {"type": "string", "description": "Directory to search in (default: current directory)"},
            "limit": {"type": "number", "description": "Maximum number of results (default: 1000)"}},
            "required": ["pattern"]})
    }
    fn call(&self, args: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let pattern = str_arg(&args, "pattern").unwrap_or_default().to_owned();
            let limit = count_arg(&args, "limit").unwrap_or(1000).max(1);
            let (root, _) = search_root(&self.0, str_arg(&args, "path")).await?;
            // Like `fd --glob`: a pattern with a `/` matches the whole path, else the file name.
            let full_path = pattern.contains('/');
            let glob = if full_path && !pattern.starts_with("**/") && pattern != "**" {
                format!("**/{}", pattern.trim_start_matches('/'))
            } else {
                pattern.clone()
            };
            let matcher = globset::GlobBuilder::new(&glob)
                .literal_separator(true)
                .build()
                .map_err(|e| ToolError::failed(format!("invalid glob {pattern:?}: {e}")))?
                .compile_matcher();
            let found = blocking(move || {
                let mut found = Vec::new();
                for entry in walker(&root, None).flatten() {
                    if entry.depth() == 0 {
                        continue;
                    }
                    let rel = relative(&root, entry.path());
                    let hit = if full_path { matcher.is_match(&rel) } else { matcher.is_match(entry.file_name()) };
                    if hit {
                        let dir = entry.file_type().is_some_and(|t| t.is_dir());
                        found.push(if dir { format!("{rel}/") } else { rel });
                        if found.len() >= limit {
                            break;
                        }
                    }
                }
                found
            })
            .await?;
            if found.is_empty() {
                return Ok(ToolOutput::text("No files found matching pattern"));
            }
            let (mut notices, mut details) = (Vec::new(), Map::new());
            if found.len() >= limit {
                notices.push(format!("{limit} results limit reached"));
                details.insert("resultLimitReached".into(), limit.into());
            }
            Ok(finish_listing(&found.join("\n"), notices, details, false))
        })
    }
}

/// `grep {pattern, path?, glob?, ignoreCase?, literal?, context?, limit?}`.
pub struct GrepTool(pub Arc<Workspace>);

struct Hit {
    path: PathBuf,
    line: usize,
    text: String,
}

impl Tool for GrepTool {
    fn read_only(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "grep"
    }
    fn description(&self) -> &str {
        "Search file contents for a pattern. Returns matching lines with file paths and line numbers. Respects .gitignore. Output is truncated to 100 matches or 50KB (whichever is hit first). Long lines are truncated to 500 chars."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {
            "pattern": {"type": "string", "description": "Search pattern (regex or literal string)"},
            "path": {"type": "string", "description": "Directory or file to search (default: current directory)"},
            "glob": {"type": "string", "description": "Filter files by glob pattern, e.g. '*.ts' or '**/*.spec.ts'"},
            "ignoreCase": {"type": "boolean", "description": "Case-insensitive search (default: false)"},
            "literal": {"type": "boolean", "description": "Treat pattern as literal string instead of regex (default: false)"},
            "context": {"type": "number", "description": "Number of lines to show before and after each match (default: 0)"},
            "limit": {"type": "number", "description": "Maximum number of matches to return (default: 100)"}},
            "required": ["pattern"]})
    }
    fn call(&self, args: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let pattern = str_arg(&args, "pattern").unwrap_or_default();
            let flag = |k: &str| args.get(k).and_then(Value::as_bool).unwrap_or(false);
            let matcher = RegexMatcherBuilder::new()
                .case_insensitive(flag("ignoreCase"))
                .fixed_strings(flag("literal"))
                .build(pattern)
                .map_err(|e| ToolError::failed(e.to_string()))?;
            let context = count_arg(&args, "context").unwrap_or(0);
            let limit = count_arg(&args, "limit").unwrap_or(100).max(1);
            let (root, _) = search_root(&self.0, str_arg(&args, "path")).await?;
            let is_dir = tokio::fs::metadata(&root).await.is_ok_and(|m| m.is_dir());
            let overrides = match str_arg(&args, "glob") {
                Some(g) => {
                    let mut o = ignore::overrides::OverrideBuilder::new(&root);
                    o.add(g).map_err(|e| ToolError::failed(format!("invalid glob {g:?}: {e}")))?;
                    Some(o.build().map_err(|e| ToolError::failed(format!("invalid glob {g:?}: {e}")))?)
                }
                None => None,
            };
            let walk_root = root.clone();
            let hits = blocking(move || {
                let mut searcher =
                    SearcherBuilder::new().line_number(true).binary_detection(BinaryDetection::quit(0)).build();
                let mut hits: Vec<Hit> = Vec::new();
                for entry in walker(&walk_root, overrides).flatten() {
                    if !entry.file_type().is_some_and(|t| t.is_file()) {
                        continue;
                    }
                    let path = entry.path().to_path_buf();
                    let _ = searcher.search_path(
                        &matcher,
                        &path,
                        grep_searcher::sinks::Lossy(|line, text| {
                            #[allow(clippy::cast_possible_truncation)] // line numbers fit
                            hits.push(Hit { path: path.clone(), line: line as usize, text: text.to_owned() });
                            Ok(hits.len() < limit)
                        }),
                    );
                    if hits.len() >= limit {
                        break;
                    }
                }
                hits
            })
            .await?;
            if hits.is_empty() {
                return Ok(ToolOutput::text("No matches found"));
            }
            let show = |p: &Path| {
                if is_dir {
                    relative(&root, p)
                } else {
                    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
                }
            };
            let mut lines = Vec::new();
            let mut cut = false;
            let mut cache: Option<(PathBuf, Vec<String>)> = None;
            for h in &hits {
                let name = show(&h.path);
                if context == 0 {
                    let text = h.text.replace("\r\n", "\n").replace('\r', "");
                    let (t, c) = truncate_line(text.strip_suffix('\n').unwrap_or(&text));
                    cut |= c;
                    lines.push(format!("{name}:{}: {t}", h.line));
                    continue;
                }
                if cache.as_ref().is_none_or(|(p, _)| *p != h.path) {
                    let body = tokio::fs::read(&h.path).await.map(|b| String::from_utf8_lossy(&b).into_owned());
                    let file_lines = body
                        .map(|b| b.replace("\r\n", "\n").replace('\r', "\n").split('\n').map(str::to_owned).collect())
                        .unwrap_or_default();
                    cache = Some((h.path.clone(), file_lines));
                }
                let file_lines = cache.as_ref().map_or(&[][..], |(_, l)| l.as_slice());
                if file_lines.is_empty() {
                    lines.push(format!("{name}:{}: (unable to read file)", h.line));
                    continue;
                }
                let start = h.line.saturating_sub(context).max(1);
                let end = (h.line + context).min(file_lines.len());
                for n in start..=end {
                    let (t, c) = truncate_line(&file_lines.get(n - 1).cloned().unwrap_or_default().replace('\r', ""));
                    cut |= c;
                    lines.push(if n == h.line { format!("{name}:{n}: {t}") } else { format!("{name}-{n}- {t}") });
                }
            }
            let (mut notices, mut details) = (Vec::new(), Map::new());
            if hits.len() >= limit {
                notices.push(format!(
                    "{limit} matches limit reached. Use limit={} for more, or refine pattern",
                    limit * 2
                ));
                details.insert("matchLimitReached".into(), limit.into());
            }
            Ok(finish_listing(&lines.join("\n"), notices, details, cut))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn run(tool: &dyn Tool, args: Value) -> ToolOutput {
        tool.call(args).await.unwrap()
    }

    #[tokio::test]
    async fn find_and_grep_follow_ripgrep_rules() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::create_dir_all(root.join("target")).unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".gitignore"), "target/\n").unwrap();
        std::fs::write(root.join("src/a.rs"), "let needle = 1;\n").unwrap();
        std::fs::write(root.join("src/deep/b.rs"), format!("{}needle\n", "x".repeat(600))).unwrap();
        std::fs::write(root.join("target/c.rs"), "needle\n").unwrap();
        std::fs::write(root.join(".git/config"), "needle\n").unwrap();
        std::fs::write(root.join(".hidden.rs"), "Needle\n").unwrap();
        let ws = Workspace::new(root);
        let find = FindTool(ws.clone());
        let text = |o: ToolOutput| o.content[0]["text"].as_str().unwrap().to_owned();
        assert_eq!(text(run(&find, json!({"pattern": "*.rs"})).await), ".hidden.rs\nsrc/a.rs\nsrc/deep/b.rs");
        assert_eq!(text(run(&find, json!({"pattern": "src/*.rs"})).await), "src/a.rs", "a / matches the whole path");
        assert_eq!(text(run(&find, json!({"pattern": "src/**/*.rs"})).await), "src/a.rs\nsrc/deep/b.rs");
        let limited = run(&find, json!({"pattern": "*.rs", "limit": 1})).await;
        assert_eq!(text(limited.clone()), ".hidden.rs\n\n[1 results limit reached]");
        assert_eq!(limited.details, Some(json!({"resultLimitReached": 1})));
        assert_eq!(text(run(&find, json!({"pattern": "*.py"})).await), "No files found matching pattern");

        let grep = GrepTool(ws);
        let out = run(&grep, json!({"pattern": "needle"})).await;
        let cut = format!("src/deep/b.rs:1: {}... [truncated]", "x".repeat(500));
        assert_eq!(
            text(out.clone()),
            format!("src/a.rs:1: let needle = 1;\n{cut}\n\n[Some lines truncated to 500 chars. Use read tool to see full lines]")
        );
        assert_eq!(out.details, Some(json!({"linesTruncated": true})));
        assert_eq!(
            text(run(&grep, json!({"pattern": "needle", "ignoreCase": true, "glob": "*.rs", "limit": 1})).await),
            ".hidden.rs:1: Needle\n\n[1 matches limit reached. Use limit=2 for more, or refine pattern]"
        );
        assert_eq!(text(run(&grep, json!({"pattern": "n.edle = 1", "literal": true})).await), "No matches found");
        assert_eq!(text(run(&grep, json!({"pattern": "needle", "path": "src/a.rs"})).await), "a.rs:1: let needle = 1;");
        assert!(grep.call(json!({"pattern": "("})).await.is_err(), "an invalid regex is an error result");
    }
}
