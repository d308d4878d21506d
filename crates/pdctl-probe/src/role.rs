//! A PD server's role at run time, over SGLang's HTTP API (0.5.23): `GET /model_info`'s
//! `disaggregation_mode` (read through the tokenizer's `config_value`, which a role switch
//! overrides; `/server_info` keeps the startup role — measured on the real server) and
//! `POST /pd_role_switch` (`entrypoints/http_server.py`: the answer's JSON with 200 on success
//! and 400 otherwise).

use std::time::Duration;

use serde_json::Value;

use crate::{snippet, Http, HttpError};

/// The role a server runs now: `prefill`, `decode` or `null`; `None`: not reported.
pub async fn running_role(http: &Http, url: &str) -> Result<Option<String>, HttpError> {
    let u = format!("{}/model_info", url.trim_end_matches('/'));
    let v = http.get_json(&u).await?;
    Ok(v.get("disaggregation_mode").and_then(Value::as_str).map(String::from))
}

/// `POST /pd_role_switch BODY` within `limit`: the answer (200 or 400 with its JSON); any other
/// status, or a body that is not the answer, is an error.
pub async fn pd_role_switch(http: &Http, url: &str, body: &Value, limit: Duration) -> Result<Value, HttpError> {
    let u = format!("{}/pd_role_switch", url.trim_end_matches('/'));
    let (status, text) = http.post_json_within(&u, body, limit).await?;
    match (status, serde_json::from_str::<Value>(&text)) {
        (200 | 400, Ok(v)) if v.get("success").is_some_and(Value::is_boolean) => Ok(v),
        _ => Err(HttpError::Status { url: u, status, body: snippet(&text) }),
    }
}
