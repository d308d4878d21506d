//! What pdctl sends to SGLang's HTTP API and reads back where a port ([`crate::ports::Probes`])
//! carries it as a type: the runtime role switch's ask (`POST /pd_role_switch`) and answer.
//! What the answers mean is decided in [`crate::sglang::role_switch`].

use pdctl_contract::records::Role;

/// What pdctl asks of a server.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The role to run.
    pub new_role: Role,
    /// The decode CUDA graphs' footprint (GB), measured on a serving decode; `None` for a flip
    /// to prefill.
    pub graph_memory_gb: Option<f64>,
    /// Check every precondition (on every DP worker) without switching.
    pub prepare_only: bool,
}

impl Ask {
    /// The request body.
    pub fn body(&self) -> serde_json::Value {
        let mut b = serde_json::json!({"new_role": self.new_role.as_str(), "prepare_only": self.prepare_only});
        if let Some(gb) = self.graph_memory_gb {
            b["decode_cuda_graph_memory_gb"] = serde_json::json!(gb);
        }
        b
    }
}

/// What a server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `success`.
    pub success: bool,
    /// `message`.
    pub message: String,
    /// `old_role`.
    pub old_role: String,
    /// `safe_to_restore`: routing to the server may be restored (nothing was torn down).
    pub safe_to_restore: bool,
}

impl Answer {
    /// The answer in a response body; `None`: not one (another server, a proxy's page).
    pub fn of(v: &serde_json::Value) -> Option<Answer> {
        Some(Answer {
            success: v.get("success")?.as_bool()?,
            message: v.get("message")?.as_str()?.to_string(),
            old_role: v.get("old_role").and_then(|r| r.as_str()).unwrap_or_default().to_string(),
            safe_to_restore: v.get("safe_to_restore").and_then(|r| r.as_bool()).unwrap_or(false),
        })
    }
}
