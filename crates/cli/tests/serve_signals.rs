//! `quench serve` as a process: its signals (the first SIGINT or SIGTERM drains, requests
//! in flight getting the grace period; a second ends the process at once) and what it says
//! at start.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A server on a free port, its log collected as it comes.
struct Serve {
    child: Child,
    port: u16,
    log: Arc<Mutex<String>>,
}

fn serve(grace: &str) -> Serve {
    serve_with(&["--shutdown-grace", grace, "--body-timeout", "60"])
}

fn serve_with(args: &[&str]) -> Serve {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quench"))
        .args(["serve", "--model", "synthetic:tiny-chat", "--port", "0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut start_log = String::new();
    let port = loop {
        let line = lines
            .next()
            .expect("the server ended before listening")
            .unwrap();
        start_log.push_str(&line);
        start_log.push('\n');
        if line.contains("\"listening\"") {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            break v["port"].as_u64().unwrap() as u16;
        }
    };
    let log = Arc::new(Mutex::new(String::new()));
    log.lock().unwrap().push_str(&start_log);
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let mut log = sink.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    Serve { child, port, log }
}

impl Serve {
    /// A request whose body never comes: in flight until the body timeout.
    fn request_in_flight(&self) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pro",
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        s
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// Waits for the process to end, at most `limit`; its exit code.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                panic!(
                    "the server was still running after {limit:?}:\n{}",
                    self.log.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn a_second_signal_ends_the_server_at_once() {
    let mut server = serve("60");
    let _in_flight = server.request_in_flight();
    server.signal(libc::SIGINT);
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server did not wait for the request in flight"
    );
    assert!(server.log.lock().unwrap().contains("shutting down"));
    server.signal(libc::SIGINT);
    let code = server.wait(Duration::from_secs(3));
    assert_eq!(code, Some(130), "{}", server.log.lock().unwrap());
}

#[test]
fn one_signal_ends_the_server_within_its_grace() {
    let mut server = serve("1");
    let _in_flight = server.request_in_flight();
    let started = Instant::now();
    server.signal(libc::SIGTERM);
    let code = server.wait(Duration::from_secs(5));
    assert_eq!(code, Some(0), "{}", server.log.lock().unwrap());
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(server.log.lock().unwrap().contains("\"stopped\""));
}

#[test]
fn listening_beyond_loopback_without_a_key_is_warned_of() {
    let warning = "without an API key";
    let mut open = serve_with(&["--host", "0.0.0.0"]);
    // The warning comes right after the listening line.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        open.log.lock().unwrap().contains(warning),
        "{}",
        open.log.lock().unwrap()
    );
    open.signal(libc::SIGTERM);
    assert_eq!(open.wait(Duration::from_secs(5)), Some(0));
    for args in [&["--host", "0.0.0.0", "--api-key", "sk-test"][..], &[][..]] {
        let mut server = serve_with(args);
        std::thread::sleep(Duration::from_millis(300));
        assert!(!server.log.lock().unwrap().contains(warning), "{args:?}");
        server.signal(libc::SIGTERM);
        assert_eq!(server.wait(Duration::from_secs(5)), Some(0));
    }
}
