//! The wire's timestamps: RFC 3339 UTC datetimes to and from microseconds since the epoch, and the
//! calendar arithmetic under them (days since 1970-01-01 to and from a proleptic Gregorian date,
//! after Howard Hinnant's algorithms). No time zones: everything on the wire is UTC.

/// Days from 0000-03-01 to 1970-01-01 in the proleptic Gregorian calendar.
const UNIX_EPOCH_DAYS: i64 = 719_468;

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - UNIX_EPOCH_DAYS
}

/// (year, month, day) of a day counted from 1970-01-01, proleptic Gregorian (Howard Hinnant's
/// algorithm): the inverse of `days_from_civil`.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + UNIX_EPOCH_DAYS;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// Parses an RFC 3339 UTC datetime (`2024-09-09T19:46:02.329308Z`, fraction optional, up to
/// nanoseconds, `Z` or `+00:00`) into microseconds since the epoch.
pub fn parse_rfc3339_us(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b.len() > 40 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    // The date and time are sliced at fixed byte offsets below, which must be char boundaries.
    if !b[..19].is_ascii() {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let digits = &text[from..to];
        if digits.bytes().all(|c| c.is_ascii_digit()) { digits.parse().ok() } else { None }
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut micros = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let padded = format!("{:0<6}", &fraction[..digits.min(6)]);
        micros = padded.parse::<i64>().ok()?;
        rest = &fraction[digits..];
    }
    if rest != "Z" && rest != "+00:00" {
        return None;
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second;
    Some(seconds * 1_000_000 + micros)
}

/// Formats microseconds since the epoch as Jetstream v2 does: six fractional digits, `Z`.
pub fn format_rfc3339_us(time_us: i64) -> String {
    let (days, in_day) = (time_us.div_euclid(86_400_000_000), time_us.rem_euclid(86_400_000_000));
    let (year, month, day) = civil_from_days(days);
    let seconds = in_day / 1_000_000;
    let text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        seconds / 3_600,
        seconds / 60 % 60,
        seconds % 60,
        in_day % 1_000_000
    );
    debug_assert_eq!(parse_rfc3339_us(&text), Some(time_us), "format/parse disagree on {time_us}");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        for days in (-800_000..800_000).step_by(997) {
            let (year, month, day) = civil_from_days(days);
            assert_eq!(days_from_civil(year, month, day), days);
        }
    }
}
