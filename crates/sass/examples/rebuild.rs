//! Writes the cubin that `build` makes from a ptxas cubin's kernel: `rebuild IN OUT`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(input), Some(output)) = (args.get(1), args.get(2)) else {
        return Err("usage: rebuild IN.cubin OUT.cubin".into());
    };
    let c = quench_sass::cubin::Cubin::parse(&std::fs::read(input)?)?;
    let k = c.kernels.first().ok_or("no kernel")?;
    let desc = quench_sass::build::KernelDesc::from_cubin(&c, k)?;
    std::fs::write(output, quench_sass::build::build(&desc)?)?;
    Ok(())
}
