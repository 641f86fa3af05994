//! quench-rt
