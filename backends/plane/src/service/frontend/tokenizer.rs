//! Prompts to token ids as the engine makes them, so the router hashes the blocks the
//! engine will cache: the model's own `tokenizer.json` read by Hugging Face's
//! `tokenizers`, and its chat template (`tokenizer_config.json`) rendered with minijinja
//! and Python's string methods (minijinja-contrib's pycompat), as Dynamo's frontend
//! renders them.
//!
//! Owns: [`PromptTokenizer`] and [`TokenizerError`].
//! vLLM's defaults are followed: a completion's text is encoded with the tokenizer's
//! special tokens (BOS), a chat's rendered template without (the template writes them),
//! each unless the request says otherwise (`add_special_tokens`); chat renders with
//! `add_generation_prompt` true.
//! Never: guess a tokenization. A model without a chat template refuses chat requests
//! with an error rather than inventing a format; a prompt the router cannot tokenize is
//! still served, routed on load alone (the caller counts it).

use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The tokenizer's files.
const TOKENIZER_FILE: &str = "tokenizer.json";
const CONFIG_FILE: &str = "tokenizer_config.json";

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer.json` is not a tokenizer `tokenizers` reads.
    #[error("{path}: not a tokenizer: {message}")]
    BadTokenizer {
        /// The file.
        path: PathBuf,
        /// The library's message.
        message: String,
    },
    /// `tokenizer_config.json` is not JSON, or a field has the wrong shape.
    #[error("{path}: {message}")]
    BadConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The chat template does not compile.
    #[error("{path}: field `chat_template`: {message}")]
    BadTemplate {
        /// The file.
        path: PathBuf,
        /// The template engine's message.
        message: String,
    },
    /// Encoding failed.
    #[error("tokenizing: {0}")]
    Encode(String),
    /// A chat request for a model without a chat template.
    #[error("the model's tokenizer has no chat template ({CONFIG_FILE}: chat_template)")]
    NoChatTemplate,
    /// Rendering the chat template failed (a message the template refuses).
    #[error("rendering the chat template: {0}")]
    Render(String),
}

/// A model's tokenizer and chat template.
pub struct PromptTokenizer {
    tokenizer: tokenizers::Tokenizer,
    /// A template environment holding the chat template as `chat`.
    chat: Option<Environment<'static>>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    source: PathBuf,
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptTokenizer")
            .field("source", &self.source)
            .field("chat_template", &self.chat.is_some())
            .finish()
    }
}

/// A special token in `tokenizer_config.json`: a string, or an object with `content`.
fn special_token(config: &serde_json::Map<String, Value>, field: &str) -> Option<String> {
    match config.get(field)? {
        Value::String(token) => Some(token.clone()),
        Value::Object(token) => token.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The chat template in `tokenizer_config.json`: a string, or a list of named ones
/// (the one named `default`).
fn chat_template(
    config: &serde_json::Map<String, Value>,
    path: &Path,
) -> Result<Option<String>, TokenizerError> {
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(template)) => Ok(Some(template.clone())),
        Some(Value::Array(named)) => Ok(named
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|entry| entry.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string)),
        Some(_) => Err(TokenizerError::BadConfig {
            path: path.to_owned(),
            message: "field `chat_template`: a string or a list of {name, template}".into(),
        }),
    }
}

/// `raise_exception(message)`, which Hugging Face chat templates call on bad input.
fn raise_exception(message: String) -> Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

impl PromptTokenizer {
    /// Loads `path`: a `tokenizer.json`, or a model directory holding one; a
    /// `tokenizer_config.json` beside it, if present, gives the chat template and the
    /// special tokens.
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let file = if path.is_dir() {
            path.join(TOKENIZER_FILE)
        } else {
            path.to_owned()
        };
        let bytes = std::fs::read(&file).map_err(|source| TokenizerError::Read {
            path: file.clone(),
            source,
        })?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|error| {
            TokenizerError::BadTokenizer {
                path: file.clone(),
                message: error.to_string(),
            }
        })?;
        let config_path = file
            .parent()
            .map_or_else(|| PathBuf::from(CONFIG_FILE), |dir| dir.join(CONFIG_FILE));
        let mut loaded = Self {
            tokenizer,
            chat: None,
            bos_token: None,
            eos_token: None,
            source: file,
        };
        if !config_path.exists() {
            return Ok(loaded);
        }
        let text =
            std::fs::read_to_string(&config_path).map_err(|source| TokenizerError::Read {
                path: config_path.clone(),
                source,
            })?;
        let config: serde_json::Map<String, Value> =
            serde_json::from_str(&text).map_err(|error| TokenizerError::BadConfig {
                path: config_path.clone(),
                message: format!("not a JSON object: {error}"),
            })?;
        loaded.bos_token = special_token(&config, "bos_token");
        loaded.eos_token = special_token(&config, "eos_token");
        if let Some(template) = chat_template(&config, &config_path)? {
            let mut environment = Environment::new();
            environment
                .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
            environment.add_function("raise_exception", raise_exception);
            environment
                .add_template_owned("chat", template)
                .map_err(|error| TokenizerError::BadTemplate {
                    path: config_path.clone(),
                    message: error.to_string(),
                })?;
            loaded.chat = Some(environment);
        }
        Ok(loaded)
    }

    /// The file the tokenizer came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Whether chat requests can be tokenized.
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// The ids of `text`, with the tokenizer's special tokens (its post-processor: BOS)
    /// when `add_special_tokens`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|error| TokenizerError::Encode(error.to_string()))
    }

    /// `messages` rendered with the chat template, a generation prompt at the end.
    pub fn render_chat(&self, messages: &Value) -> Result<String, TokenizerError> {
        let environment = self.chat.as_ref().ok_or(TokenizerError::NoChatTemplate)?;
        let template = environment
            .get_template("chat")
            .map_err(|error| TokenizerError::Render(error.to_string()))?;
        template
            .render(minijinja::context! {
                messages => minijinja::Value::from(minijinja::value::Serde(messages)),
                add_generation_prompt => true,
                bos_token => self.bos_token.as_deref().unwrap_or_default(),
                eos_token => self.eos_token.as_deref().unwrap_or_default(),
            })
            .map_err(|error| TokenizerError::Render(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer with a BOS post-processor, as `tokenizers` writes one.
    const TOKENIZER: &str = r#"{
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                        "rstrip": false, "normalized": false, "special": true}],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
      "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"<s>": 0, "<unk>": 1, "hello": 2, "world": 3,
                "user": 4, ":": 5, "assistant": 6}, "unk_token": "<unk>"}
    }"#;

    fn write_model(dir: &Path, config: Option<&str>) {
        std::fs::write(dir.join(TOKENIZER_FILE), TOKENIZER).unwrap();
        if let Some(config) = config {
            std::fs::write(dir.join(CONFIG_FILE), config).unwrap();
        }
    }

    #[test]
    fn text_is_encoded_with_and_without_special_tokens() {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), None);
        let tokenizer = PromptTokenizer::load(&dir.path().join(TOKENIZER_FILE)).unwrap();
        assert_eq!(tokenizer.encode("hello world", true).unwrap(), [0, 2, 3]);
        assert_eq!(tokenizer.encode("hello world", false).unwrap(), [2, 3]);
        assert!(!tokenizer.has_chat_template());
        assert!(matches!(
            tokenizer.render_chat(&serde_json::json!([])),
            Err(TokenizerError::NoChatTemplate)
        ));
    }

    #[test]
    fn chat_renders_with_the_template_and_python_string_methods() {
        let dir = tempfile::tempdir().unwrap();
        let config = r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>",
          "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'].strip() }} {% endfor %}{% if add_generation_prompt %}assistant :{% endif %}"}"#;
        write_model(dir.path(), Some(config));
        let tokenizer = PromptTokenizer::load(dir.path()).unwrap();
        let messages = serde_json::json!([{"role": "user", "content": "  hello world "}]);
        let text = tokenizer.render_chat(&messages).unwrap();
        assert_eq!(text, "<s>user : hello world assistant :");
        assert_eq!(
            tokenizer.encode(&text, false).unwrap(),
            [0, 4, 5, 2, 3, 6, 5]
        );
    }

    #[test]
    fn bad_files_are_errors_naming_the_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let missing = PromptTokenizer::load(dir.path()).unwrap_err();
        assert!(missing.to_string().contains(TOKENIZER_FILE), "{missing}");
        std::fs::write(dir.path().join(TOKENIZER_FILE), "{}").unwrap();
        let bad = PromptTokenizer::load(dir.path()).unwrap_err();
        assert!(matches!(bad, TokenizerError::BadTokenizer { .. }), "{bad}");
        write_model(dir.path(), Some(r#"{"chat_template": "{% for %}"}"#));
        let template = PromptTokenizer::load(dir.path()).unwrap_err();
        assert!(template.to_string().contains("chat_template"), "{template}");
        write_model(dir.path(), Some("[]"));
        let config = PromptTokenizer::load(dir.path()).unwrap_err();
        assert!(config.to_string().contains(CONFIG_FILE), "{config}");
    }
}
