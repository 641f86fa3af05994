//! `quench top`: the GPU monitor (terminal view, one JSON reading, or JSON lines).

use std::time::Duration;

use quench_top::modes;
use quench_top::{NvmlSource, SampleSource, ServerPoller, SourceError};

#[derive(clap::Args)]
pub struct TopArgs {
    /// Print one reading as JSON and exit; exits non-zero when NVML or a GPU is missing.
    #[arg(long, conflicts_with_all = ["watch", "once_text"])]
    json: bool,
    /// Stream one JSON line per reading.
    #[arg(long, conflicts_with = "once_text")]
    watch: bool,
    /// Seconds between readings (--watch) or the monitor's starting refresh interval.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    interval: f64,
    /// Stop --watch after this many lines.
    #[arg(long, requires = "watch", value_name = "N")]
    count: Option<u64>,
    /// A quench server's metrics URL [default: http://127.0.0.1:8080/metrics, shown
    /// only when a quench server answers there].
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// Read no server's metrics.
    #[arg(long, conflicts_with = "server")]
    no_server: bool,
    /// Draw one frame of the monitor as text on stdout and exit.
    #[arg(long)]
    once_text: bool,
    /// The frame size for --once-text, WIDTHxHEIGHT.
    #[arg(
        long,
        default_value = "160x48",
        requires = "once_text",
        value_name = "WxH"
    )]
    size: String,
    /// Load NVML from this file instead of libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    nvml_library: Option<String>,
}

/// Time between the two readings of --json, so that rates have an interval.
const JSON_WINDOW: Duration = Duration::from_millis(250);
/// Readings behind a --once-text frame.
const FRAME_READINGS: usize = 3;

fn interval(seconds: f64) -> Result<Duration, String> {
    if !(0.05..=3600.0).contains(&seconds) {
        return Err(format!(
            "--interval {seconds}: choose between 0.05 and 3600 seconds"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn size(text: &str) -> Result<(u16, u16), String> {
    let bad = || format!("--size {text}: expected WIDTHxHEIGHT, such as 160x48");
    let (w, h) = text.split_once('x').ok_or_else(bad)?;
    Ok((
        w.trim().parse().map_err(|_| bad())?,
        h.trim().parse().map_err(|_| bad())?,
    ))
}

pub fn run(a: &TopArgs) -> Result<(), String> {
    let interval = interval(a.interval)?;
    let mut server = (!a.no_server).then(|| ServerPoller::new(a.server.as_deref()));
    let opened = match &a.nvml_library {
        Some(path) => NvmlSource::open_library(path),
        None => NvmlSource::open(),
    };
    let mut nvml: Result<NvmlSource, SourceError> = opened;
    let source = nvml
        .as_mut()
        .map(|s| s as &mut dyn SampleSource)
        .map_err(|e| e.clone());
    if a.json {
        let value = modes::json_once(source.map_err(|e| e.to_string())?, &mut server, JSON_WINDOW)
            .map_err(|e| e.to_string())?;
        let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
        println!("{text}");
        Ok(())
    } else if a.watch {
        let src = source.map_err(|e| e.to_string())?;
        let mut out = std::io::stdout().lock();
        modes::watch(src, &mut server, interval, a.count, &mut out).map_err(|e| e.to_string())
    } else if a.once_text {
        let (w, h) = size(&a.size)?;
        print!(
            "{}",
            modes::frame_text(source, &mut server, interval, FRAME_READINGS, w, h)
        );
        Ok(())
    } else {
        modes::tui(source, &mut server, interval).map_err(|e| e.to_string())
    }
}
