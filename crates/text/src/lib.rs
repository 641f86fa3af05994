//! quench-text
