//! Five-field cron expressions (`minute hour day-of-month month day-of-week`), evaluated in
//! an IANA time zone. Day-of-month and day-of-week combine as in Vixie cron: when both are
//! restricted, either may match.

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cron {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    days_any: bool,
    weekdays_any: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// Why a cron expression does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CronError {
    #[error("cron needs 5 fields (minute hour day-of-month month day-of-week), got {0}")]
    Fields(usize),
    #[error("{field}: {why}")]
    Field {
        field: &'static str,
        why: FieldError,
    },
}

/// What is wrong in one field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FieldError {
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("step {0:?} is not a number")]
    Step(String),
    #[error("a step of 0 never matches")]
    ZeroStep,
    #[error("{item:?} is outside {min}-{max}")]
    OutOfRange { item: String, min: u32, max: u32 },
}

fn parse_value(s: &str, names: &[&str], base: u32) -> Result<u32, FieldError> {
    if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
        return Ok(i as u32 + base);
    }
    s.parse().map_err(|_| FieldError::NotANumber(s.into()))
}

/// Parses one field into a bit set of the allowed values in `min..=max`.
fn parse_field(
    field: &str,
    min: u32,
    max: u32,
    names: &[&str],
    name_base: u32,
) -> Result<u64, FieldError> {
    let mut bits = 0u64;
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().map_err(|_| FieldError::Step(s.into()))?),
            None => (item, 1),
        };
        if step == 0 {
            return Err(FieldError::ZeroStep);
        }
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (
                parse_value(a, names, name_base)?,
                parse_value(b, names, name_base)?,
            )
        } else {
            let v = parse_value(range, names, name_base)?;
            (v, if item.contains('/') { max } else { v })
        };
        if lo < min || hi > max || lo > hi {
            return Err(FieldError::OutOfRange {
                item: item.into(),
                min,
                max,
            });
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

impl Cron {
    pub(crate) fn parse(expr: &str) -> Result<Cron, CronError> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let [m, h, dom, mon, dow] = fields.as_slice() else {
            return Err(CronError::Fields(fields.len()));
        };
        let field = |field| move |why| CronError::Field { field, why };
        let mut weekdays = parse_field(dow, 0, 7, &DAYS, 0).map_err(field("day-of-week"))?;
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1; // 7 is Sunday too
        }
        Ok(Cron {
            minutes: parse_field(m, 0, 59, &[], 0).map_err(field("minute"))?,
            hours: parse_field(h, 0, 23, &[], 0).map_err(field("hour"))?,
            days: parse_field(dom, 1, 31, &[], 0).map_err(field("day-of-month"))?,
            months: parse_field(mon, 1, 12, &MONTHS, 1).map_err(field("month"))?,
            weekdays,
            days_any: *dom == "*",
            weekdays_any: *dow == "*",
        })
    }

    fn day_matches(&self, d: Date) -> bool {
        let dom = self.days & (1 << d.day()) != 0;
        let dow = self.weekdays & (1 << d.weekday().to_sunday_zero_offset()) != 0;
        if self.days_any || self.weekdays_any {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first matching minute strictly after `after_ms`, in epoch milliseconds.
    pub(crate) fn next_after(&self, after_ms: i64, tz: &TimeZone) -> Option<i64> {
        let after = Timestamp::from_millisecond(after_ms).ok()?;
        let start = after.to_zoned(tz.clone()).datetime();
        // The next whole minute.
        let mut t: DateTime = start
            .date()
            .at(start.hour(), start.minute(), 0, 0)
            .checked_add(1.minute())
            .ok()?;
        // Four years covers every valid expression (29 February included).
        let limit = t.checked_add(4.years()).ok()?;
        while t < limit {
            if self.months & (1 << t.month()) == 0 {
                t = t
                    .date()
                    .first_of_month()
                    .checked_add(1.month())
                    .ok()?
                    .at(0, 0, 0, 0);
                continue;
            }
            if !self.day_matches(t.date()) {
                t = t.date().tomorrow().ok()?.at(0, 0, 0, 0);
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t.date().at(t.hour(), 0, 0, 0).checked_add(1.hour()).ok()?;
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            // A civil time skipped by a DST gap maps forward; one repeated maps to its first.
            let ms = t.to_zoned(tz.clone()).ok()?.timestamp().as_millisecond();
            if ms > after_ms {
                return Some(ms);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    #[test]
    fn every_five_minutes() {
        let c = Cron::parse("*/5 * * * *").unwrap();
        let utc = TimeZone::UTC;
        assert_eq!(
            c.next_after(ms("2026-01-01T10:02:30Z"), &utc),
            Some(ms("2026-01-01T10:05:00Z"))
        );
        assert_eq!(
            c.next_after(ms("2026-01-01T10:05:00Z"), &utc),
            Some(ms("2026-01-01T10:10:00Z"))
        );
    }

    #[test]
    fn weekdays_at_nine_in_a_time_zone() {
        let c = Cron::parse("0 9 * * mon-fri").unwrap();
        let tz = TimeZone::get("Europe/Berlin").unwrap();
        // Saturday 2026-01-03 → Monday 2026-01-05 09:00 CET = 08:00 UTC.
        assert_eq!(
            c.next_after(ms("2026-01-03T12:00:00Z"), &tz),
            Some(ms("2026-01-05T08:00:00Z"))
        );
    }

    #[test]
    fn day_of_month_or_day_of_week() {
        // The 1st, or any Sunday.
        let c = Cron::parse("0 0 1 * sun").unwrap();
        let utc = TimeZone::UTC;
        // After Fri 2026-01-02: Sunday 2026-01-04.
        assert_eq!(
            c.next_after(ms("2026-01-02T00:00:00Z"), &utc),
            Some(ms("2026-01-04T00:00:00Z"))
        );
    }

    #[test]
    fn leap_day() {
        let c = Cron::parse("0 0 29 2 *").unwrap();
        assert_eq!(
            c.next_after(ms("2026-03-01T00:00:00Z"), &TimeZone::UTC),
            Some(ms("2028-02-29T00:00:00Z"))
        );
    }

    #[test]
    fn bad_expressions_say_which_field() {
        for (expr, field) in [
            ("* * *", "5 fields"),
            ("61 * * * *", "minute"),
            ("* 24 * * *", "hour"),
            ("* * 0 * *", "day-of-month"),
            ("* * * 13 *", "month"),
            ("* * * * funday", "day-of-week"),
            ("*/0 * * * *", "step"),
        ] {
            let err = Cron::parse(expr).unwrap_err();
            assert!(err.to_string().contains(field), "{expr}: {err}");
        }
    }
}
