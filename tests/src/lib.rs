pub mod fleet;
pub mod runtime;
