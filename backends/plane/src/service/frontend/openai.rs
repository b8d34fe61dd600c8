//! The parts of OpenAI's completions API the front door reads and writes: the request's
//! model, prompt (text, token ids, or chat messages), streaming, cache salt and
//! special-token flag, and Dynamo's `nvext.backend_instance_id` (the engine a request is
//! pinned to); the answer's usage; errors in the shape vLLM answers with.
//!
//! Owns: [`Endpoint`], [`Prompt`], [`ProxyRequest`] (a parsed body, and the body to
//! forward), [`Usage`] ([`usage_of`]), [`RequestError`] and [`error_json`].
//! Invariants: the body forwarded is the client's, field for field, except that a
//! streamed request always asks the engine for its usage (`stream_options.include_usage`:
//! the router needs the cached tokens it reports); [`ProxyRequest::client_wants_usage`]
//! says whether the client's stream shows that chunk; and `nvext`, the router's own
//! field, stays with the router.
//! Never: tokenize (`tokenizer` does) or talk to an engine.

use bytes::Bytes;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// The OpenAI endpoints the router fronts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`: a prompt, text or token ids.
    Completions,
    /// `POST /v1/chat/completions`: messages, rendered with the model's chat template.
    ChatCompletions,
}

impl Endpoint {
    /// The path, on the router and on the engine.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
    }

    /// `completions` or `chat_completions`, for labels.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::ChatCompletions => "chat_completions",
        }
    }
}

/// What the engine will prefill, as the request gives it.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Token ids: hashed as they are.
    Tokens(Vec<u32>),
    /// Text: tokenized with the model's tokenizer.
    Text(String),
    /// Chat messages (the `messages` array): rendered with the chat template, then
    /// tokenized.
    Chat(Value),
}

/// Why a request body was refused (400), before any engine saw it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Not JSON.
    #[error("the body is not JSON: {0}")]
    BadJson(String),
    /// JSON, but not an object.
    #[error("the body must be a JSON object")]
    NotObject,
    /// A field the endpoint needs is absent.
    #[error("`{0}` is required")]
    Missing(&'static str),
    /// A field has the wrong shape.
    #[error("`{field}`: {expected}")]
    BadField {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
}

impl RequestError {
    /// A stable label for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            RequestError::BadJson(_) => "bad_json",
            RequestError::NotObject | RequestError::Missing(_) | RequestError::BadField { .. } => {
                "bad_request"
            }
        }
    }
}

/// A request body as the front door reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyRequest {
    /// Which endpoint it came to.
    pub endpoint: Endpoint,
    /// `model`, if given.
    pub model: Option<String>,
    /// The prompt.
    pub prompt: Prompt,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage` as the client set it.
    pub client_wants_usage: bool,
    /// `cache_salt` (vLLM's per-request prefix-cache isolation key).
    pub cache_salt: Option<String>,
    /// `add_special_tokens`, if the client set it (vLLM: true for completions, false for
    /// chat, whose template writes them).
    pub add_special_tokens: Option<bool>,
    /// `nvext.backend_instance_id`: the engine (its worker id) the request must be served
    /// by, as Dynamo's frontend reads it: no routing decision, no retry elsewhere. What a
    /// profile through the router needs to time each engine as it serves.
    pub pinned: Option<u64>,
    /// The whole object, to forward.
    body: Map<String, Value>,
}

fn string_field(
    body: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<String>, RequestError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(RequestError::BadField {
            field,
            expected: "a string",
        }),
    }
}

fn bool_field(
    body: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<bool>, RequestError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(_) => Err(RequestError::BadField {
            field,
            expected: "true or false",
        }),
    }
}

/// Token ids, or `None` when `values` are not all integers in u32.
fn token_ids(values: &[Value]) -> Option<Vec<u32>> {
    values
        .iter()
        .map(|value| value.as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect()
}

const PROMPT_SHAPE: &str = "a string, an array of token ids, or an array of one of those \
     (the router takes one prompt per request)";

fn completions_prompt(value: Option<&Value>) -> Result<Prompt, RequestError> {
    let bad = RequestError::BadField {
        field: "prompt",
        expected: PROMPT_SHAPE,
    };
    match value {
        None | Some(Value::Null) => Err(RequestError::Missing("prompt")),
        Some(Value::String(text)) => Ok(Prompt::Text(text.clone())),
        Some(Value::Array(items)) if items.is_empty() => Err(bad),
        Some(Value::Array(items)) => {
            if let Some(ids) = token_ids(items) {
                return Ok(Prompt::Tokens(ids));
            }
            match items.as_slice() {
                [Value::String(text)] => Ok(Prompt::Text(text.clone())),
                [Value::Array(inner)] if !inner.is_empty() => {
                    token_ids(inner).map(Prompt::Tokens).ok_or(bad)
                }
                _ => Err(bad),
            }
        }
        Some(_) => Err(bad),
    }
}

/// Parses a request body sent to `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<ProxyRequest, RequestError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|error| RequestError::BadJson(error.to_string()))?;
    let Value::Object(body) = value else {
        return Err(RequestError::NotObject);
    };
    let prompt = match endpoint {
        Endpoint::Completions => completions_prompt(body.get("prompt"))?,
        Endpoint::ChatCompletions => match body.get("messages") {
            None | Some(Value::Null) => return Err(RequestError::Missing("messages")),
            Some(messages @ Value::Array(items)) if !items.is_empty() => {
                Prompt::Chat(messages.clone())
            }
            Some(_) => {
                return Err(RequestError::BadField {
                    field: "messages",
                    expected: "a non-empty array of messages",
                })
            }
        },
    };
    let client_wants_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(options)) => bool_field(options, "include_usage")?.unwrap_or(false),
        Some(_) => {
            return Err(RequestError::BadField {
                field: "stream_options",
                expected: "an object",
            })
        }
    };
    let pinned = match body.get("nvext") {
        None | Some(Value::Null) => None,
        Some(Value::Object(nvext)) => match nvext.get("backend_instance_id") {
            None | Some(Value::Null) => None,
            Some(id) => Some(id.as_u64().ok_or(RequestError::BadField {
                field: "nvext.backend_instance_id",
                expected: "a worker id (an unsigned integer)",
            })?),
        },
        Some(_) => {
            return Err(RequestError::BadField {
                field: "nvext",
                expected: "an object",
            })
        }
    };
    Ok(ProxyRequest {
        endpoint,
        model: string_field(&body, "model")?,
        pinned,
        stream: bool_field(&body, "stream")?.unwrap_or(false),
        client_wants_usage,
        cache_salt: string_field(&body, "cache_salt")?.filter(|salt| !salt.is_empty()),
        add_special_tokens: bool_field(&body, "add_special_tokens")?,
        prompt,
        body,
    })
}

impl ProxyRequest {
    /// The body to send the engine: the client's, with a streamed request asking for
    /// its usage chunk.
    pub fn forward_body(&self) -> Bytes {
        let mut body = self.body.clone();
        // Dynamo's extensions are the front door's; vLLM would only warn about them.
        body.remove("nvext");
        if self.stream {
            let options = body
                .entry("stream_options")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(options) = options {
                options.insert("include_usage".into(), Value::Bool(true));
            }
        }
        Bytes::from(serde_json::to_vec(&Value::Object(body)).unwrap_or_default())
    }
}

/// When a streamed answer's output arrived: its first chunk carrying tokens, its last,
/// and the gaps between such chunks (inter-token latency as vLLM's benchmark client
/// counts it). The front door and `kvtwin bench serve` time answers alike with it.
#[derive(Clone, Debug, Default)]
pub struct TokenTimes {
    /// The first chunk carrying output.
    pub first: Option<Instant>,
    /// The latest chunk carrying output.
    pub last: Option<Instant>,
    /// The gaps between chunks carrying output, the first `max_gaps` given to
    /// [`TokenTimes::note`] at most (memory per request is bounded; the mean of all of
    /// them is `(last - first) / (chunks - 1)`).
    pub gaps: Vec<Duration>,
}

impl TokenTimes {
    /// Notes a chunk carrying output, arrived at `now`.
    pub fn note(&mut self, now: Instant, max_gaps: usize) {
        match self.last {
            None => self.first = Some(now),
            Some(last) if self.gaps.len() < max_gaps => self.gaps.push(now - last),
            Some(_) => {}
        }
        self.last = Some(now);
    }
}

/// What an answer says it cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: u64,
    /// `completion_tokens`.
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens` (vLLM with
    /// `--enable-prompt-tokens-details`), if given.
    pub cached_tokens: Option<u64>,
}

/// The `usage` object of an answer or of a stream's chunk, if it has one.
pub fn usage_of(answer: &Value) -> Option<Usage> {
    let usage = answer.get("usage")?.as_object()?;
    Some(Usage {
        prompt_tokens: usage.get("prompt_tokens")?.as_u64()?,
        completion_tokens: usage
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        cached_tokens: usage
            .get("prompt_tokens_details")
            .and_then(|details| details.get("cached_tokens"))
            .and_then(Value::as_u64),
    })
}

/// Output tokens a streamed chunk carries, as far as can be told without a tokenizer:
/// the token ids it returns if it returns them, else one per choice with text (vLLM
/// sends one token a chunk unless told otherwise).
pub fn chunk_tokens(chunk: &Value) -> u64 {
    let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
        return 0;
    };
    choices
        .iter()
        .map(|choice| {
            if let Some(ids) = choice.get("token_ids").and_then(Value::as_array) {
                return ids.len() as u64;
            }
            let text = choice
                .get("text")
                .or_else(|| choice.get("delta").and_then(|delta| delta.get("content")))
                .and_then(Value::as_str);
            u64::from(text.is_some_and(|text| !text.is_empty()))
        })
        .sum()
}

/// An error body as vLLM's OpenAI server writes one.
pub fn error_json(message: &str, kind: &str, code: u16) -> Value {
    json!({ "error": { "message": message, "type": kind, "param": null, "code": code } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prompt_shape_parses_and_several_prompts_are_refused() {
        let parse_prompt = |body: &str| parse(Endpoint::Completions, body.as_bytes());
        assert_eq!(
            parse_prompt(r#"{"prompt":"hi"}"#).unwrap().prompt,
            Prompt::Text("hi".into())
        );
        assert_eq!(
            parse_prompt(r#"{"prompt":[1,2,3]}"#).unwrap().prompt,
            Prompt::Tokens(vec![1, 2, 3])
        );
        assert_eq!(
            parse_prompt(r#"{"prompt":["hi"]}"#).unwrap().prompt,
            Prompt::Text("hi".into())
        );
        assert_eq!(
            parse_prompt(r#"{"prompt":[[4,5]]}"#).unwrap().prompt,
            Prompt::Tokens(vec![4, 5])
        );
        for bad in [
            r#"{"prompt":["a","b"]}"#,
            r#"{"prompt":[[1],[2]]}"#,
            r#"{"prompt":[]}"#,
            r#"{"prompt":[-1]}"#,
            r#"{"prompt":[4294967296]}"#,
            r#"{"prompt":7}"#,
        ] {
            let error = parse_prompt(bad).unwrap_err();
            assert!(
                matches!(
                    error,
                    RequestError::BadField {
                        field: "prompt",
                        ..
                    }
                ),
                "{bad}: {error:?}"
            );
        }
        assert_eq!(
            parse_prompt(r#"{"model":"m"}"#).unwrap_err(),
            RequestError::Missing("prompt")
        );
        assert_eq!(parse_prompt("[1]").unwrap_err(), RequestError::NotObject);
        assert_eq!(parse_prompt("{").unwrap_err().reason(), "bad_json");
    }

    #[test]
    fn chat_needs_messages_and_fields_of_the_wrong_type_are_named() {
        let chat = parse(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":"t"}"#,
        )
        .unwrap();
        assert!(matches!(chat.prompt, Prompt::Chat(_)));
        assert_eq!(chat.cache_salt.as_deref(), Some("t"));
        assert_eq!(chat.model.as_deref(), Some("m"));
        assert_eq!(
            parse(Endpoint::ChatCompletions, br#"{"messages":[]}"#).unwrap_err(),
            RequestError::BadField {
                field: "messages",
                expected: "a non-empty array of messages"
            }
        );
        let error = parse(Endpoint::Completions, br#"{"prompt":"x","stream":"yes"}"#).unwrap_err();
        assert!(error.to_string().contains("`stream`"), "{error}");
        let error = parse(Endpoint::Completions, br#"{"prompt":"x","model":3}"#).unwrap_err();
        assert!(error.to_string().contains("`model`"), "{error}");
    }

    #[test]
    fn a_streamed_request_is_forwarded_asking_for_usage_and_nothing_else_changes() {
        let body = br#"{"model":"m","prompt":[1,2],"stream":true,"max_tokens":8,"extra":{"a":1}}"#;
        let request = parse(Endpoint::Completions, body).unwrap();
        assert!(request.stream);
        assert!(!request.client_wants_usage);
        let forwarded: Value = serde_json::from_slice(&request.forward_body()).unwrap();
        let mut expected: Value = serde_json::from_slice(body).unwrap();
        expected["stream_options"] = json!({"include_usage": true});
        assert_eq!(forwarded, expected);
        let plain = parse(Endpoint::Completions, br#"{"prompt":[1],"max_tokens":2}"#).unwrap();
        let forwarded: Value = serde_json::from_slice(&plain.forward_body()).unwrap();
        assert_eq!(forwarded, json!({"prompt":[1],"max_tokens":2}));
        let asked = parse(
            Endpoint::Completions,
            br#"{"prompt":[1],"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert!(asked.client_wants_usage);
    }

    #[test]
    fn a_pinned_request_names_its_engine_and_nvext_stays_with_the_router() {
        let body = br#"{"prompt":[1],"nvext":{"backend_instance_id":7,"greed_sampling":true}}"#;
        let request = parse(Endpoint::Completions, body).unwrap();
        assert_eq!(request.pinned, Some(7));
        let forwarded: Value = serde_json::from_slice(&request.forward_body()).unwrap();
        assert_eq!(forwarded, json!({"prompt":[1]}));
        let unpinned = parse(Endpoint::Completions, br#"{"prompt":[1],"nvext":{}}"#).unwrap();
        assert_eq!(unpinned.pinned, None);
        for (bad, field) in [
            (
                r#"{"prompt":[1],"nvext":{"backend_instance_id":-1}}"#,
                "nvext.backend_instance_id",
            ),
            (
                r#"{"prompt":[1],"nvext":{"backend_instance_id":"a"}}"#,
                "nvext.backend_instance_id",
            ),
            (r#"{"prompt":[1],"nvext":3}"#, "nvext"),
        ] {
            let error = parse(Endpoint::Completions, bad.as_bytes()).unwrap_err();
            assert!(
                matches!(error, RequestError::BadField { field: named, .. } if named == field),
                "{bad}: {error:?}"
            );
        }
    }

    #[test]
    fn a_clients_numbers_reach_the_engine_as_written() {
        // A float whose default (fast) parse lands one ulp off the nearest double: the
        // openai_request fuzz target found the forwarded value differing from the parsed
        // one until serde_json's float_roundtrip feature was on.
        let body = br#"{"prompt":[1,2],"temperature":3142222222222222222222222222222222222222222222222222222222222222222222222222222222,"top_p":0.123456789012345678}"#;
        let request = parse(Endpoint::Completions, body).unwrap();
        let forwarded: Value = serde_json::from_slice(&request.forward_body()).unwrap();
        let original: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(forwarded, original);
        assert_eq!(
            forwarded["temperature"].as_f64(),
            Some(3.1422222222222222e81)
        );
    }

    #[test]
    fn usage_and_chunk_tokens_are_read_from_vllm_answers() {
        let answer = json!({"choices":[{"text":"abc"}],"usage":{"prompt_tokens":256,
            "completion_tokens":8,"total_tokens":264,"prompt_tokens_details":{"cached_tokens":224}}});
        assert_eq!(
            usage_of(&answer),
            Some(Usage {
                prompt_tokens: 256,
                completion_tokens: 8,
                cached_tokens: Some(224)
            })
        );
        let no_details = json!({"usage":{"prompt_tokens":3,"completion_tokens":1}});
        assert_eq!(usage_of(&no_details).unwrap().cached_tokens, None);
        assert_eq!(usage_of(&json!({"usage": null})), None);
        assert_eq!(chunk_tokens(&json!({"choices":[{"text":"a"}]})), 1);
        assert_eq!(chunk_tokens(&json!({"choices":[{"text":""}]})), 0);
        assert_eq!(
            chunk_tokens(&json!({"choices":[{"text":"","token_ids":[5,6]}]})),
            2
        );
        assert_eq!(
            chunk_tokens(&json!({"choices":[{"delta":{"content":"x"}}]})),
            1
        );
        assert_eq!(chunk_tokens(&json!({"choices":[],"usage":{}})), 0);
    }
}
