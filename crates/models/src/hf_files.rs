//! The optional files beside a Hugging Face checkpoint's weights that describe its text side:
//! JSON configs such as `tokenizer_config.json` and `generation_config.json`, and the chat
//! template, which lives in `tokenizer_config.json` or in `chat_template.jinja`.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Why an optional checkpoint file that exists could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HfFileError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The text of the file at `path`, or `None` when there is no such file.
fn read_optional(path: &Path) -> Result<Option<String>, HfFileError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HfFileError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The JSON value in the file at `path`, or `None` when there is no such file.
pub fn read_optional_json(path: &Path) -> Result<Option<Value>, HfFileError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| HfFileError::Json {
            path: path.to_owned(),
            source,
        })
}

/// The chat template source of the checkpoint in `dir`: `chat_template` of its
/// `tokenizer_config.json` (given as `tokenizer_config`), which is a string or a list of named
/// templates of which the one named "default" (else the first) is the chat template; without
/// it, `chat_template.jinja`, where newer checkpoints keep it. `None` when neither has one.
pub fn chat_template_source(
    dir: &Path,
    tokenizer_config: Option<&Value>,
) -> Result<Option<String>, HfFileError> {
    match tokenizer_config.and_then(|c| c.get("chat_template")) {
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            };
            Ok(named("default")
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_owned))
        }
        _ => read_optional(&dir.join("chat_template.jinja")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A fresh directory under the system's temporary directory.
    fn scratch_dir(tag: &str) -> PathBuf {
        let n: u64 = rand::random();
        let dir = std::env::temp_dir().join(format!("quench-hf-files-{tag}-{n:016x}"));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    #[test]
    fn json_files_read_missing_or_refused_by_path() {
        let dir = scratch_dir("json");
        let value = json!({"bos_token": format!("<s{}>", rand::random::<u32>()), "n": rand::random::<i32>()});
        let good = dir.join("good.json");
        std::fs::write(&good, value.to_string()).expect("write");
        assert_eq!(read_optional_json(&good).expect("read"), Some(value));

        assert_eq!(
            read_optional_json(&dir.join("absent.json")).expect("read"),
            None
        );

        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{\"a\": ").expect("write");
        let e = read_optional_json(&bad).unwrap_err();
        assert!(
            matches!(&e, HfFileError::Json { path, .. } if *path == bad),
            "{e:?}"
        );
        assert!(e.to_string().contains("bad.json: invalid JSON"), "{e}");

        // A directory where a file is expected: an I/O error, not "missing".
        let e = read_optional_json(&dir).unwrap_err();
        assert!(
            matches!(&e, HfFileError::Io { path, .. } if *path == dir),
            "{e:?}"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn chat_template_comes_from_the_config_then_the_jinja_file() {
        let dir = scratch_dir("template");
        let config = json!({"chat_template": "{{ messages }}"});
        assert_eq!(
            chat_template_source(&dir, Some(&config)).expect("template"),
            Some("{{ messages }}".into())
        );
        let named = json!({"chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"},
        ]});
        assert_eq!(
            chat_template_source(&dir, Some(&named)).expect("template"),
            Some("D".into())
        );
        let unnamed = json!({"chat_template": [{"name": "rag", "template": "R"}]});
        assert_eq!(
            chat_template_source(&dir, Some(&unnamed)).expect("template"),
            Some("R".into())
        );

        assert_eq!(chat_template_source(&dir, None).expect("template"), None);
        std::fs::write(dir.join("chat_template.jinja"), "J").expect("write");
        assert_eq!(
            chat_template_source(&dir, Some(&json!({"bos_token": "<s>"}))).expect("template"),
            Some("J".into())
        );
        // The config's template wins over the file.
        assert_eq!(
            chat_template_source(&dir, Some(&config)).expect("template"),
            Some("{{ messages }}".into())
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
