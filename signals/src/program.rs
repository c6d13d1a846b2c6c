//! Reward programs (`kind = "program"`, docs/signals.md): any executable that reads one JSON line per
//! response on stdin and writes one JSON object per response on stdout, once per batch; or, with
//! `persistent = true`, one process for the whole run (a grader that loads its model once) answering
//! each batch's lines in order. Every failure (cannot start, crashes, hangs past the timeout, prints
//! something that is not a JSON object, too few or too many lines) is an error that names the
//! program, and the process is stopped.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// The most bytes of one output line of a reward program (untrusted output: bounded memory).
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// The stderr lines kept for error messages.
const STDERR_LINES: usize = 20;
/// The most characters of one stderr line or of an echoed output line in a message.
const ECHO_CHARS: usize = 300;

/// A configured reward program; shared by every signal that names the same command and settings.
pub struct Program {
    /// The command as given (program and arguments).
    pub command: Vec<String>,
    pub timeout: Duration,
    pub persistent: bool,
    /// The running process of a persistent program (started at its first batch).
    running: Mutex<Option<Running>>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("command", &self.command)
            .field("timeout", &self.timeout)
            .field("persistent", &self.persistent)
            .finish()
    }
}

enum Out {
    Line(Vec<u8>),
    TooLong,
    Eof,
    Failed(String),
}

struct Running {
    child: Child,
    /// Bytes for the process's stdin (a writer thread writes them, so that a program that answers
    /// before reading all its input cannot deadlock against us); dropped to close stdin.
    input: Option<Sender<Vec<u8>>>,
    output: Receiver<Out>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

fn echo(text: &str) -> String {
    let mut s: String = text.chars().take(ECHO_CHARS).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}

impl Running {
    fn start(command: &[String]) -> Result<Running, String> {
        let mut child = Command::new(&command[0])
            .args(&command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start it: {e}"))?;
        let stdin: ChildStdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr_pipe = child.stderr.take().expect("piped stderr");
        let (input, input_rx) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            let mut stdin = stdin;
            for bytes in input_rx {
                // A program that exits early closes the pipe: its exit is reported by the reader.
                if stdin.write_all(&bytes).and_then(|_| stdin.flush()).is_err() {
                    break;
                }
            }
        });
        let (output_tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                let read = (&mut reader)
                    .take(MAX_LINE_BYTES as u64 + 1)
                    .read_until(b'\n', &mut line);
                let message = match read {
                    Ok(0) => Out::Eof,
                    Ok(_) if line.len() > MAX_LINE_BYTES => Out::TooLong,
                    Ok(_) => Out::Line(line),
                    Err(e) => Out::Failed(e.to_string()),
                };
                let last = !matches!(message, Out::Line(_));
                if output_tx.send(message).is_err() || last {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let kept = stderr.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr_pipe);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut reader).take(1 << 20).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                        if kept.len() == STDERR_LINES {
                            kept.pop_front();
                        }
                        kept.push_back(echo(text.trim_end()));
                    }
                }
            }
        });
        Ok(Running {
            child,
            input: Some(input),
            output,
            stderr,
        })
    }

    /// The end of a message: the exit status (when the process has exited) and its last stderr lines.
    fn context(&mut self) -> String {
        // Give the stderr reader a moment to collect what a crashing program printed last.
        std::thread::sleep(Duration::from_millis(50));
        let mut out = String::new();
        if let Ok(Some(status)) = self.child.try_wait() {
            out.push_str(&format!(" (it exited with {status})"));
        }
        let lines = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        if !lines.is_empty() {
            out.push_str("; its stderr ended with:\n");
            for l in lines.iter() {
                out.push_str("    ");
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    fn stop(&mut self) {
        self.input = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Program {
    pub fn new(command: Vec<String>, timeout: Duration, persistent: bool) -> Program {
        Program {
            command,
            timeout,
            persistent,
            running: Mutex::new(None),
        }
    }

    /// The command as written, for messages.
    pub fn label(&self) -> String {
        self.command.join(" ")
    }

    /// Sends one JSON line per request and returns one JSON object per request, in order. On any
    /// failure the process is stopped and the error says what happened.
    pub fn run(&self, requests: &[Value]) -> Result<Vec<Map<String, Value>>, String> {
        let label = self.label();
        let mut guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() || !self.persistent {
            *guard = Some(
                Running::start(&self.command)
                    .map_err(|e| format!("reward program `{label}`: {e}"))?,
            );
        }
        let running = guard.as_mut().expect("started");
        let result = self.exchange(running, requests);
        if result.is_err() || !self.persistent {
            if let Some(mut r) = guard.take() {
                r.stop();
            }
        }
        result.map_err(|e| format!("reward program `{label}`: {e}"))
    }

    fn exchange(
        &self,
        running: &mut Running,
        requests: &[Value],
    ) -> Result<Vec<Map<String, Value>>, String> {
        let mut bytes = Vec::new();
        for r in requests {
            serde_json::to_writer(&mut bytes, r).map_err(|e| e.to_string())?;
            bytes.push(b'\n');
        }
        let deadline = Instant::now() + self.timeout;
        let sent = running
            .input
            .as_ref()
            .map(|input| input.send(bytes).is_ok())
            .unwrap_or(false);
        if !sent {
            return Err(format!("its stdin is closed{}", running.context()));
        }
        if !self.persistent {
            // Close stdin after the batch: a one-shot program reads to the end of its input.
            running.input = None;
        }
        let n = requests.len();
        let mut out = Vec::with_capacity(n);
        let timeout_message = |read: usize| {
            format!(
                "gave no answer within {} s (timeout_s): {read} of {n} output lines read; it was stopped",
                self.timeout.as_secs_f64()
            )
        };
        while out.len() < n {
            let wait = deadline.saturating_duration_since(Instant::now());
            let line = match running.output.recv_timeout(wait) {
                Ok(Out::Line(line)) => line,
                Ok(Out::Eof) | Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "its output ended after {} of {n} lines (one JSON object per input line){}",
                        out.len(),
                        running.context()
                    ))
                }
                Ok(Out::TooLong) => {
                    return Err(format!(
                        "output line {} is longer than {} MiB",
                        out.len() + 1,
                        MAX_LINE_BYTES >> 20
                    ))
                }
                Ok(Out::Failed(e)) => {
                    return Err(format!("cannot read its output: {e}{}", running.context()))
                }
                Err(RecvTimeoutError::Timeout) => {
                    let message = timeout_message(out.len());
                    return Err(format!("{message}{}", running.context()));
                }
            };
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            out.push(parse_line(text, out.len() + 1)?);
        }
        if !self.persistent {
            // A one-shot program must then exit, successfully, without printing more.
            loop {
                let wait = deadline.saturating_duration_since(Instant::now());
                match running.output.recv_timeout(wait) {
                    Ok(Out::Line(line)) if String::from_utf8_lossy(&line).trim().is_empty() => {}
                    Ok(Out::Line(line)) => {
                        return Err(format!(
                        "printed more than {n} lines (one JSON object per input line); line {}: {}",
                        n + 1,
                        echo(String::from_utf8_lossy(&line).trim())
                    ))
                    }
                    Ok(_) | Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => {
                        let message = format!(
                            "did not exit within {} s (timeout_s) after its {n} lines; it was stopped",
                            self.timeout.as_secs_f64()
                        );
                        return Err(format!("{message}{}", running.context()));
                    }
                }
            }
            loop {
                match running.child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        let context = running.context();
                        return Err(format!(
                            "exited with {status} after printing its {n} lines{}",
                            context.replace(&format!(" (it exited with {status})"), "")
                        ));
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Ok(None) => {
                        return Err(format!(
                        "did not exit within {} s (timeout_s) after its {n} lines; it was stopped",
                        self.timeout.as_secs_f64()
                    ))
                    }
                    Err(e) => return Err(format!("cannot wait for it: {e}")),
                }
            }
        }
        Ok(out)
    }
}

/// One output line: a JSON object. NaN and infinities (which Python's `json.dumps` writes as `NaN`,
/// `Infinity`) are named as such.
fn parse_line(text: &str, line: usize) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(format!(
            "output line {line} is not a JSON object: {}",
            echo(text)
        )),
        Err(_) if ["NaN", "Infinity"].iter().any(|w| text.contains(w)) => Err(format!(
            "output line {line} holds a non-finite number (NaN or Infinity), which a reward cannot be: {}",
            echo(text)
        )),
        Err(e) => Err(format!(
            "output line {line} is not JSON ({e}): {}",
            echo(text)
        )),
    }
}
