//! quench-ir
