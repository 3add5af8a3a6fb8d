//! `sidejob replay --check`: rebuild the rows from the event log and compare.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};
use serde_json::{Map, Value};

use super::{apply_patch, migrate, schema, Entity, Op, RegistryError, Result};

/// What a replay found.
#[derive(Debug, Default)]
pub(crate) struct ReplayReport {
    pub events: u64,
    pub rows_checked: u64,
    /// One line per difference: table, key, column, live value, replayed value.
    pub differences: Vec<String>,
}

impl ReplayReport {
    pub(crate) fn ok(&self) -> bool {
        self.differences.is_empty()
    }
}

/// Replays every event of the registry at `db_path` into a fresh in-memory database built by
/// the same migrations, and compares every row of every replayed table.
pub(crate) fn replay_check(db_path: &Path) -> Result<ReplayReport> {
    let live = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| RegistryError::Open {
        path: db_path.into(),
        source,
    })?;
    live.busy_timeout(std::time::Duration::from_secs(5))?;
    let mut fresh = Connection::open_in_memory()?;
    migrate(&mut fresh)?;

    let mut report = ReplayReport::default();
    {
        let tx = fresh.transaction()?;
        let mut stmt =
            live.prepare("SELECT seq, entity, entity_id, op, patch FROM events ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let seq: i64 = row.get(0)?;
            let entity: String = row.get(1)?;
            let id: String = row.get(2)?;
            let op: String = row.get(3)?;
            let patch: String = row.get(4)?;
            let entity = Entity::parse(&entity)
                .ok_or_else(|| RegistryError::Corrupt(format!("event {seq}: entity {entity:?}")))?;
            let op = Op::parse(&op)
                .ok_or_else(|| RegistryError::Corrupt(format!("event {seq}: op {op:?}")))?;
            let patch: Map<String, Value> = serde_json::from_str(&patch)
                .map_err(|e| RegistryError::Corrupt(format!("event {seq}: patch: {e}")))?;
            if let Err(e) = apply_patch(&tx, entity, &id, op, &patch) {
                report
                    .differences
                    .push(format!("event {seq} does not apply: {e}"));
            }
            report.events += 1;
        }
        tx.commit()?;
    }

    for (table, key) in schema::REPLAYED_TABLES {
        let a = dump(&live, table, key)?;
        let b = dump(&fresh, table, key)?;
        let mut ia = a.iter().peekable();
        let mut ib = b.iter().peekable();
        loop {
            match (ia.peek(), ib.peek()) {
                (None, None) => break,
                (Some((ka, _)), None) => {
                    report
                        .differences
                        .push(format!("{table} {ka}: row has no events"));
                    ia.next();
                }
                (None, Some((kb, _))) => {
                    report.differences.push(format!(
                        "{table} {kb}: events rebuild a row that is missing"
                    ));
                    ib.next();
                }
                (Some((ka, ra)), Some((kb, rb))) => {
                    if ka < kb {
                        report
                            .differences
                            .push(format!("{table} {ka}: row has no events"));
                        ia.next();
                    } else if kb < ka {
                        report.differences.push(format!(
                            "{table} {kb}: events rebuild a row that is missing"
                        ));
                        ib.next();
                    } else {
                        for ((col, va), (_, vb)) in ra.iter().zip(rb.iter()) {
                            if va != vb {
                                report.differences.push(format!(
                                    "{table} {ka}: {col} is {va:?} but events say {vb:?}"
                                ));
                            }
                        }
                        report.rows_checked += 1;
                        ia.next();
                        ib.next();
                    }
                }
            }
        }
    }
    Ok(report)
}

type Dumped = Vec<(String, Vec<(String, rusqlite::types::Value)>)>;

fn dump(conn: &Connection, table: &str, key: &str) -> Result<Dumped> {
    let mut stmt = conn.prepare(&format!("SELECT * FROM {table} ORDER BY {key}"))?;
    let cols: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
    let key_idx = cols.iter().position(|c| c == key).unwrap_or(0);
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let mut values = Vec::with_capacity(cols.len());
        for (i, col) in cols.iter().enumerate() {
            values.push((col.clone(), row.get::<_, rusqlite::types::Value>(i)?));
        }
        let key = match &values[key_idx].1 {
            rusqlite::types::Value::Text(s) => s.clone(),
            other => format!("{other:?}"),
        };
        out.push((key, values));
    }
    Ok(out)
}
