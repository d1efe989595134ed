//! The environment overrides of [`Config::load`](super::Config::load) and
//! [`Config::from_env`](super::Config::from_env): `CONVOY__SECTION__KEY`
//! for any key, then `CONVOY_BROKER_URL` and `CONVOY_INSTANCE_ID`, written
//! into the TOML table before it is read (see the module docs of
//! [`config`](super)).

use std::ffi::OsString;

use crate::error::Error;

/// The process's environment variables that start with `CONVOY_`.
pub(super) fn convoy_vars() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| k.to_str().is_some_and(|k| k.starts_with("CONVOY_")))
        .collect()
}

/// The general form's prefix: `CONVOY__SECTION__KEY`.
const ENV_PREFIX: &str = "CONVOY__";
/// `[broker] url`.
pub const ENV_BROKER_URL: &str = "CONVOY_BROKER_URL";
/// `[server] instance_id`.
pub const ENV_INSTANCE_ID: &str = "CONVOY_INSTANCE_ID";

/// Writes the overrides of `vars` into `table`; returns the names of the
/// variables applied, in the order applied.
pub(super) fn apply_env(
    table: &mut toml::Table,
    vars: &[(OsString, OsString)],
    file: &str,
) -> Result<Vec<String>, Error> {
    let mut general: Vec<(String, Vec<String>, String)> = Vec::new();
    let mut aliases: Vec<(String, Vec<String>, String)> = Vec::new();
    for (name, value) in vars {
        let Some(name) = name.to_str() else { continue };
        let path: Vec<String> = if let Some(rest) = name.strip_prefix(ENV_PREFIX) {
            rest.split("__")
                .enumerate()
                .map(|(i, seg)| {
                    // A handler's name keeps its case: `[handlers."Name"]`.
                    let handler_name =
                        i == 1 && rest.to_ascii_lowercase().starts_with("handlers__");
                    if handler_name {
                        seg.to_owned()
                    } else {
                        seg.to_ascii_lowercase()
                    }
                })
                .collect()
        } else if name == ENV_BROKER_URL {
            vec!["broker".into(), "url".into()]
        } else if name == ENV_INSTANCE_ID {
            vec!["server".into(), "instance_id".into()]
        } else {
            continue;
        };
        let env_error = |message: String| Error::Config {
            file: format!("{file} (environment variable {name})"),
            message,
        };
        if path.iter().any(String::is_empty) {
            return Err(env_error(format!(
                "`{name}` does not name a key; use CONVOY__SECTION__KEY, for example CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS"
            )));
        }
        let Some(value) = value.to_str() else {
            return Err(env_error(format!("the value of {name} is not UTF-8")));
        };
        let entry = (name.to_owned(), path, value.to_owned());
        if name.starts_with(ENV_PREFIX) {
            general.push(entry);
        } else {
            aliases.push(entry);
        }
    }
    general.sort();
    let mut applied = Vec::new();
    for (name, path, value) in general.into_iter().chain(aliases) {
        set_path(table, &path, env_value(&value)).map_err(|message| Error::Config {
            file: format!("{file} (environment variable {name})"),
            message,
        })?;
        applied.push(name);
    }
    Ok(applied)
}

/// An environment value as TOML: a number, boolean, quoted string or
/// array when it reads as one, else the text as a string.
fn env_value(text: &str) -> toml::Value {
    let probe = format!("v = {text}");
    match probe.parse::<toml::Table>() {
        Ok(mut t) => match t.remove("v") {
            Some(
                v @ (toml::Value::Integer(_)
                | toml::Value::Float(_)
                | toml::Value::Boolean(_)
                | toml::Value::String(_)
                | toml::Value::Array(_)),
            ) => v,
            _ => toml::Value::String(text.to_owned()),
        },
        Err(_) => toml::Value::String(text.to_owned()),
    }
}

fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("no key named".to_owned());
    };
    let mut here = table;
    let mut walked = Vec::new();
    for seg in parents {
        walked.push(seg.as_str());
        let next = here
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = match next {
            toml::Value::Table(t) => t,
            _ => {
                return Err(format!(
                    "`{}` is a value, not a section, so it has no key `{last}`",
                    walked.join(".")
                ));
            }
        };
    }
    here.insert(last.clone(), value);
    Ok(())
}
