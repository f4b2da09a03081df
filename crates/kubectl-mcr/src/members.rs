//! `kubectl mcr members TYPE/NAME`: each member's state with a hub
//! object, as its status lists them (past 100 members, those not in sync
//! first, and the rest counted).

use std::process::ExitCode;

use crate::Error;
use crate::hub::{Hub, HubObject};

pub(crate) async fn run(hub: &Hub, object: &str) -> Result<ExitCode, Error> {
    let object = HubObject::find(hub, object).await?;
    let seen = object.read().await?;
    if !seen.propagated {
        return Err(Error::Refused(format!(
            "{}: no propagation has written its status (yet)",
            object.shown
        )));
    }
    let slots: Vec<&str> = seen
        .rollout
        .iter()
        .flat_map(|rollout| &rollout.updating)
        .map(|member| member.cluster.as_str())
        .collect();
    let mut rows = vec![
        ["CLUSTER", "STATE", "REVISION", "SLOT", "REASON"]
            .map(String::from)
            .to_vec(),
    ];
    for member in &seen.members {
        rows.push(vec![
            member.cluster.clone(),
            member.state.clone(),
            member.revision.clone().unwrap_or_default(),
            if slots.contains(&member.cluster.as_str()) {
                "yes"
            } else {
                ""
            }
            .to_string(),
            member.reason.clone().unwrap_or_default(),
        ]);
    }
    print!("{}", table(&rows));
    let total: u64 = seen.counts.values().sum();
    if total > seen.members.len() as u64 {
        let counts: Vec<String> = seen
            .counts
            .iter()
            .map(|(state, count)| format!("{state}: {count}"))
            .collect();
        println!(
            "{} of {total} members listed; {}",
            seen.members.len(),
            counts.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `rows` as kubectl prints a table: columns padded to their widest cell,
/// three spaces apart, trailing space trimmed.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or_default();
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            rows.iter()
                .filter_map(|row| row.get(column))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or_default()
        })
        .collect();
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(&format!("{cell:<width$}   "));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_pads_each_column_to_its_widest_cell() {
        let rows = vec![
            vec!["CLUSTER".to_string(), "STATE".to_string()],
            vec!["east-1".to_string(), "InSync".to_string()],
        ];
        assert_eq!(table(&rows), "CLUSTER   STATE\neast-1    InSync\n");
    }
}
