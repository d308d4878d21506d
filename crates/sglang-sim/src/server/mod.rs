//! The HTTP face of the simulator and its lifecycle: load → port opens → warmup → ready line.
//! Its rooms: the shared state of a server ([`state`]), the lifecycle ([`lifecycle`]), the route
//! table and API key ([`routes`]), the state endpoints ([`admin`]) and the generate endpoints
//! ([`generate`]), the runtime role switch ([`role_switch`]).

mod admin;
mod generate;
mod lifecycle;
pub mod role_switch;
mod routes;
mod state;
mod weight_update;

pub use lifecycle::run;
pub use routes::{served_routes, ADMIN_ROUTES, API_KEY_EXEMPT};
pub use state::*;
