//! quench-models
