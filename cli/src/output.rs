//! What inboxctl prints: a line at a time to stdout, a reader that went away ending it
//! quietly.

/// Prints a line to stdout. A reader that went away (`inboxctl events | head`) ends the
/// program quietly instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::emit(&format!($($arg)*)) };
}

pub(crate) fn emit(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(1);
    }
}
