//! quench-kernels
