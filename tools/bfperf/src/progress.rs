//! The progress line of `-a` sweeps on stderr: `bfperf: size 3 of 23 (8 bytes), 1.2 s
//! elapsed`, rewritten in place. Shown only when stderr is a terminal (never in logs or
//! pipes); `--json` does not silence it, since JSON goes to stdout (perftest's `--out_json`
//! does not silence its table either).

use std::io::Write;
use std::time::{Duration, Instant};

/// The progress of a sweep over `n` sizes.
pub struct Progress {
    on: bool,
    n: usize,
    start: Instant,
}

/// The text of the line for size `i` (0-based) of `n`.
pub fn line(i: usize, n: usize, bytes: usize, elapsed: Duration) -> String {
    format!(
        "bfperf: size {} of {n} ({bytes} bytes), {:.1} s elapsed",
        i + 1,
        elapsed.as_secs_f64()
    )
}

/// Whether stderr is a terminal.
fn stderr_is_terminal() -> bool {
    // SAFETY: isatty only reads the descriptor's state.
    unsafe { libc::isatty(libc::STDERR_FILENO) == 1 }
}

impl Progress {
    /// A progress line for a sweep of `n` sizes, shown when `wanted` (an `-a` sweep measured
    /// here), there is more than one size, and stderr is a terminal.
    pub fn new(n: usize, wanted: bool) -> Progress {
        Progress {
            on: wanted && n > 1 && stderr_is_terminal(),
            n,
            start: Instant::now(),
        }
    }

    /// Size `i` (0-based) of `bytes` starts.
    pub fn step(&self, i: usize, bytes: usize) {
        if self.on {
            let mut e = std::io::stderr().lock();
            let _ = write!(
                e,
                "\r\x1b[K{}",
                line(i, self.n, bytes, self.start.elapsed())
            );
            let _ = e.flush();
        }
    }

    /// Clears the line (before a result line is printed, and at the end).
    pub fn clear(&self) {
        if self.on {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_from_one_and_shows_the_size_and_time() {
        assert_eq!(
            line(2, 23, 8, Duration::from_millis(1300)),
            "bfperf: size 3 of 23 (8 bytes), 1.3 s elapsed"
        );
        // Not wanted, or a single size: never shown.
        assert!(!Progress::new(23, false).on);
        assert!(!Progress::new(1, true).on);
    }
}
