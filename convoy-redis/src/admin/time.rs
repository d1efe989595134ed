//! Times as the operators' tools print them.

/// Milliseconds since the Unix epoch as `2026-01-31 12:00:00.123 UTC`
/// (the command line and the operator page print every time so).
pub fn utc(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ),
        // Beyond the year 9999: the number as it is.
        Err(_) => format!("{ms} ms after 1970-01-01 UTC"),
    }
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn civil_dates_and_leap_days() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(utc(1_764_424_287_123), "2025-11-29 13:51:27.123 UTC");
    }
}
