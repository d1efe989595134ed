//! The question asked before an action, on the terminal.

use std::io::{BufRead, IsTerminal, Write};

use crate::error::CliError;

/// Asks on the terminal unless `yes`; refuses without a terminal.
pub fn confirm(question: &str, yes: bool, action: &'static str) -> Result<(), CliError> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(CliError::NotConfirmed { action });
    }
    ask(question, &mut stdin.lock(), &mut std::io::stderr(), action)
}

/// Writes the question, reads one line: `y` or `yes` proceeds, anything
/// else declines, end of input refuses.
fn ask(
    question: &str,
    input: &mut impl BufRead,
    output: &mut impl Write,
    action: &'static str,
) -> Result<(), CliError> {
    write!(output, "{question} [y/N] ")?;
    output.flush()?;
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        writeln!(output)?;
        return Err(CliError::NotConfirmed { action });
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(CliError::Declined { action }),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn answer(text: &str) -> (Result<(), CliError>, String) {
        let mut out = Vec::new();
        let r = ask("Skip?", &mut Cursor::new(text.as_bytes()), &mut out, "skip");
        (r, String::from_utf8(out).expect("utf-8"))
    }

    #[test]
    fn only_yes_proceeds() {
        let (r, shown) = answer("y\n");
        assert!(r.is_ok());
        assert_eq!(shown, "Skip? [y/N] ");
        assert!(answer("YES\n").0.is_ok());
        for no in ["\n", "n\n", "yess\n", "sure\n"] {
            let (r, _) = answer(no);
            assert!(matches!(r, Err(CliError::Declined { .. })), "{no:?}");
        }
        let (r, _) = answer("");
        let e = r.expect_err("closed stdin");
        assert!(e.to_string().contains("pass --yes"), "{e}");
    }
}
