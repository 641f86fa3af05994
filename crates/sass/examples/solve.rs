//! Solves the tables from cubins: `solve OUT.json A.cubin B.cubin ...`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mut code = Vec::new();
    for path in &args[2..] {
        let c = quench_sass::cubin::Cubin::parse(&std::fs::read(path)?)?;
        for k in &c.kernels {
            code.extend_from_slice(c.text(k));
        }
    }
    let corpus = quench_sass::probe::instances(&code)?;
    let t = std::time::Instant::now();
    let (tables, summary) = quench_sass::probe::solve(&corpus, &nvdisasm_version())?;
    eprintln!(
        "{:?} in {:?}",
        {
            let mut s = summary.clone();
            s.unparsed.truncate(5);
            s
        },
        t.elapsed()
    );
    // One form per line, so that a change of the tables reads as a diff.
    let mut out = format!(
        "{{\"format\": {}, \"arch\": {}, \"nvdisasm\": {}, \"forms\": [\n",
        serde_json::to_string(&tables.format)?,
        serde_json::to_string(&tables.arch)?,
        serde_json::to_string(&tables.nvdisasm)?
    );
    for (i, f) in tables.forms.iter().enumerate() {
        let sep = if i + 1 == tables.forms.len() { "" } else { "," };
        out.push_str(&format!("{}{sep}\n", serde_json::to_string(f)?));
    }
    out.push_str("]}\n");
    std::fs::write(&args[1], out)?;
    let t = quench_sass::table::Tables::from_file(tables)?;
    let c = quench_sass::probe::check(&corpus, &t);
    eprintln!("{c:#?}");
    if let Some(receipt) = args
        .first()
        .map(|_| std::path::Path::new(&args[1]).with_file_name("receipt.json"))
    {
        let r = serde_json::json!({
            "format": "quench-sass-probe-receipt/1",
            "probe": "cargo run -p quench-sass --example solve -- isa/sm90/encoding/forms.json CUBINS (the library's kernels, defaults, ptxas -arch=sm_90)",
            "cubins": args.len() - 2,
            "instructions": summary.instances,
            "templates": summary.templates,
            "forms": summary.forms,
            "opcodes": summary.opcodes,
            "flipped_words_disassembled": summary.flips,
            "control_bit_flips_that_changed_text": summary.control_flips_visible,
            "control_bit_flips_nvdisasm_rejected": summary.control_flips_illegal,
            "check": c,
        });
        std::fs::write(receipt, serde_json::to_string_pretty(&r)? + "\n")?;
    }
    Ok(())
}

fn nvdisasm_version() -> String {
    quench_sass::tools::find("nvdisasm")
        .ok()
        .and_then(|p| quench_sass::tools::run(&p, &["--version"]).ok())
        .and_then(|(_, out, _)| out.lines().last().map(str::to_string))
        .unwrap_or_default()
}
