//! OpenAI's error answer: `{"error": {"message", "type", "param", "code"}}` with a 4xx or
//! 5xx status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The field at fault, if one is.
    pub param: Option<String>,
    /// OpenAI's `code` (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.into()), code: None }
    }

    /// A 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: None, code: None }
    }

    /// With OpenAI's `code`.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            429 => "rate_limit_exceeded",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
