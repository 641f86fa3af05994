//! A server on a free port with the synthetic models, and a plain HTTP/1.1 client that
//! can also misbehave (slow, malformed, gone).
#![allow(dead_code)] // each test binary uses a different part

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use quench_serve::{ServeConfig, Server};
use serde_json::Value;
use tokio::sync::oneshot;

pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The synthetic chat and embedding models, on port 0.
pub fn config() -> ServeConfig {
    ServeConfig {
        models: vec!["synthetic:tiny-chat".parse().unwrap()],
        embedding_models: vec!["synthetic:tiny-embed".parse().unwrap()],
        host: "127.0.0.1".into(),
        port: 0,
        ..ServeConfig::default()
    }
}

impl TestServer {
    pub fn start(config: ServeConfig) -> TestServer {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let server = Server::start(config).await.unwrap();
                addr_tx.send(server.local_addr().unwrap()).unwrap();
                server
                    .run(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        TestServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Asks the server to shut down and waits until it has.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Asks the server to shut down without waiting; dropping it then waits.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    pub fn get(&self, path: &str) -> Response {
        request(self.addr, "GET", path, &[], None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        request(
            self.addr,
            "POST",
            path,
            &[],
            Some(body.to_string().as_bytes()),
        )
    }

    pub fn post_raw(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        request(self.addr, "POST", path, headers, Some(body))
    }

    pub fn delete(&self, path: &str) -> Response {
        request(self.addr, "DELETE", path, &[], None)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: ").map(str::to_owned))
            .collect()
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

/// One request on its own connection (`Connection: close`), read to the end.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Response {
    let mut s = connect(addr);
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    // A header given with an empty value is left out (and so is its default).
    for (k, v) in headers.iter().filter(|(_, v)| !v.is_empty()) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    if let Some(b) = body {
        s.write_all(b).unwrap();
    }
    read_response(&mut BufReader::new(s))
}

/// Reads a response: status line, headers, and a body by length, chunks or to the end.
pub fn read_response(r: &mut impl BufRead) -> Response {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no status line: {line:?}"))
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = get("content-length") {
        body.resize(len.parse().unwrap(), 0);
        r.read_exact(&mut body).unwrap();
    } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            let size = usize::from_str_radix(line.trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    Response {
        status,
        headers,
        body,
    }
}
