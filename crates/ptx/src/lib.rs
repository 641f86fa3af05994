//! quench-ptx
