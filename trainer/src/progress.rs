//! Progress of a run: a single redrawn line with a bar on a terminal, plain lines otherwise.

use std::fmt;
use std::io::Write;

/// What the training loop reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A line of information (warm start done, checkpoint written, …).
    Info(String),
    /// A step finished.
    Step(StepReport),
}

#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// Steps done (1-based).
    pub step: usize,
    pub steps: usize,
    pub reward: f64,
    pub kl: Option<f64>,
    /// Greedy held-out accuracy, on the steps that evaluate.
    pub eval_accuracy: Option<f64>,
    pub step_s: f64,
    /// Estimated seconds left (mean step time so far × steps left).
    pub eta_s: f64,
}

fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

impl fmt::Display for StepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {}/{} reward {:.3}",
            self.step, self.steps, self.reward
        )?;
        if let Some(kl) = self.kl {
            write!(f, " kl {kl:.4}")?;
        }
        if let Some(accuracy) = self.eval_accuracy {
            write!(f, " eval accuracy {accuracy:.3}")?;
        }
        write!(f, " {:.2}s/step ETA {}", self.step_s, clock(self.eta_s))
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Info(line) => f.write_str(line),
            Event::Step(report) => report.fmt(f),
        }
    }
}

/// Renders events to a writer (stderr for `rlx run`).
pub struct Progress<W: Write> {
    out: W,
    terminal: bool,
    /// A bar line is on screen (not yet ended by a newline).
    drawn: bool,
    last_eval: Option<f64>,
}

const BAR: usize = 24;

impl Progress<std::io::Stderr> {
    /// Progress on stderr, as a bar when stderr is a terminal.
    pub fn stderr() -> Self {
        use std::io::IsTerminal;
        let terminal =
            std::io::stderr().is_terminal() && std::env::var_os("TERM") != Some("dumb".into());
        Progress::new(std::io::stderr(), terminal)
    }
}

impl<W: Write> Progress<W> {
    pub fn new(out: W, terminal: bool) -> Self {
        Progress {
            out,
            terminal,
            drawn: false,
            last_eval: None,
        }
    }

    pub fn show(&mut self, event: &Event) {
        // Progress output is best effort: a closed stderr must not stop training.
        let _ = self.render(event);
    }

    fn render(&mut self, event: &Event) -> std::io::Result<()> {
        match event {
            Event::Info(line) => {
                if self.drawn {
                    write!(self.out, "\r\x1b[2K")?;
                    self.drawn = false;
                }
                writeln!(self.out, "{line}")?;
            }
            Event::Step(report) if self.terminal => {
                if report.eval_accuracy.is_some() {
                    self.last_eval = report.eval_accuracy;
                }
                let filled = (report.step * BAR)
                    .checked_div(report.steps)
                    .unwrap_or(BAR)
                    .min(BAR);
                let mut shown = report.clone();
                shown.eval_accuracy = self.last_eval;
                write!(
                    self.out,
                    "\r\x1b[2K[{}{}] {shown}",
                    "#".repeat(filled),
                    "-".repeat(BAR - filled)
                )?;
                self.drawn = true;
                if report.step == report.steps {
                    writeln!(self.out)?;
                    self.drawn = false;
                }
            }
            Event::Step(report) => writeln!(self.out, "{report}")?,
        }
        self.out.flush()
    }

    /// End a bar line left on screen (after an error, say).
    pub fn finish(&mut self) {
        if self.drawn {
            let _ = writeln!(self.out);
            self.drawn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(step: usize, eval: Option<f64>) -> Event {
        Event::Step(StepReport {
            step,
            steps: 4,
            reward: 0.5,
            kl: Some(0.0123),
            eval_accuracy: eval,
            step_s: 0.25,
            eta_s: 75.0,
        })
    }

    #[test]
    fn plain_lines_off_a_terminal() {
        let mut buffer = Vec::new();
        let mut progress = Progress::new(&mut buffer, false);
        progress.show(&Event::Info("warm start done".into()));
        progress.show(&report(1, None));
        progress.show(&report(2, Some(0.75)));
        assert_eq!(
            String::from_utf8(buffer).unwrap(),
            "warm start done\nstep 1/4 reward 0.500 kl 0.0123 0.25s/step ETA 1:15\n\
             step 2/4 reward 0.500 kl 0.0123 eval accuracy 0.750 0.25s/step ETA 1:15\n"
        );
    }

    #[test]
    fn one_redrawn_line_on_a_terminal() {
        let mut buffer = Vec::new();
        let mut progress = Progress::new(&mut buffer, true);
        progress.show(&report(1, Some(0.5)));
        progress.show(&report(2, None));
        progress.show(&Event::Info("checkpoint".into()));
        progress.show(&report(4, None));
        let text = String::from_utf8(buffer).unwrap();
        assert_eq!(
            text,
            "\r\x1b[2K[######------------------] step 1/4 reward 0.500 kl 0.0123 eval accuracy 0.500 0.25s/step ETA 1:15\
             \r\x1b[2K[############------------] step 2/4 reward 0.500 kl 0.0123 eval accuracy 0.500 0.25s/step ETA 1:15\
             \r\x1b[2Kcheckpoint\n\
             \r\x1b[2K[########################] step 4/4 reward 0.500 kl 0.0123 eval accuracy 0.500 0.25s/step ETA 1:15\n"
        );
    }
}
