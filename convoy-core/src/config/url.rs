//! URLs in messages: [`redact_url`] hides a URL's secrets, [`url_secrets`]
//! lists them (for hiding them wherever a message quotes the URL), and
//! [`cluster_nodes`] reads the nodes of a `redis+cluster://` URL (which
//! redaction and the Redis connection both need).

/// A URL with its secrets replaced by `***`, for logs and messages: the
/// password of its user info (`redis://user:***@host/`) and the value of a
/// `pass` or `password` query parameter (where redis-rs reads the password
/// of a `unix://` / `redis+unix://` socket URL:
/// `unix:///run/redis.sock?pass=***`). Parsed with a URL parser; text that
/// does not parse as a URL is shown only when it cannot hold a secret (no
/// `@`, no `?`), else as `scheme://<hidden: not a valid URL>`.
pub fn redact_url(url: &str) -> String {
    if let Some(Ok(nodes)) = cluster_nodes(url) {
        // A cluster URL lists several hosts, which no URL parser takes:
        // each node's URL carries the same credentials.
        let scheme = url.split_once("://").map_or("redis+cluster", |(s, _)| s);
        let hosts: Vec<String> = nodes
            .iter()
            .map(|n| {
                let r = redact_url(n);
                let after = r.split_once("://").map_or(r.as_str(), |(_, a)| a);
                after.split(['/']).next().unwrap_or("").to_owned()
            })
            .collect();
        let tail = url
            .split_once("://")
            .and_then(|(_, rest)| rest.find(['/', '?']).map(|i| &rest[i..]))
            .unwrap_or("");
        return format!("{scheme}://{}{}", hosts.join(","), redact_url_query(tail));
    }
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let mut changed = false;
            if parsed.password().is_some() {
                // Only fails for URLs that cannot have a password, and
                // this one has one.
                changed |= parsed.set_password(Some("***")).is_ok();
            }
            if parsed.query_pairs().any(|(k, _)| is_secret_param(&k)) {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if is_secret_param(&k) {
                            "***".to_owned()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
                changed = true;
            }
            if changed {
                parsed.to_string()
            } else {
                url.to_owned()
            }
        }
        Err(_) if !url.contains('@') && !url.contains('?') => url.to_owned(),
        Err(_) => match url.split_once("://") {
            Some((scheme, _))
                if scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
            {
                format!("{scheme}://<hidden: not a valid URL>")
            }
            _ => "<hidden: not a valid URL>".to_owned(),
        },
    }
}

/// The secrets of a URL as they may appear in text quoting it: the
/// password of its user info and the values of `pass` / `password` query
/// parameters, each as written and percent-decoded (for a cluster URL,
/// those of its nodes' URLs, which carry its credentials and query). Empty
/// when the URL does not parse or has none.
pub fn url_secrets(url: &str) -> Vec<String> {
    if let Some(Ok(nodes)) = cluster_nodes(url) {
        let mut out: Vec<String> = nodes.iter().flat_map(|n| url_secrets(n)).collect();
        out.sort();
        out.dedup();
        return out;
    }
    let Ok(parsed) = url::Url::parse(url) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(pw) = parsed.password() {
        out.push(pw.to_owned());
        if let Ok(decoded) = percent_decoded(pw) {
            out.push(decoded);
        }
    }
    for (k, v) in parsed.query_pairs() {
        if is_secret_param(&k) {
            out.push(v.into_owned());
        }
    }
    if let Some(q) = parsed.query() {
        for pair in q.split('&') {
            if let Some((k, v)) = pair.split_once('=')
                && is_secret_param(k)
            {
                out.push(v.to_owned());
            }
        }
    }
    out.retain(|s| !s.is_empty());
    out.sort();
    out.dedup();
    out
}

fn is_secret_param(name: &str) -> bool {
    matches!(name.to_ascii_lowercase().as_str(), "pass" | "password")
}

fn percent_decoded(s: &str) -> Result<String, std::str::Utf8Error> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|e| e.utf8_error())
}

/// The nodes of a `redis+cluster://[user:password@]h1:p1,h2:p2/[?..]` (or
/// `rediss+cluster://`) URL, each as a single-node URL with the same
/// credentials, TLS and query; `None` for a URL of one server.
#[doc(hidden)]
pub fn cluster_nodes(url: &str) -> Option<Result<Vec<String>, String>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return None,
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let query = tail
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    let path = tail.split('?').next().unwrap_or("").trim_matches('/');
    if !path.is_empty() && path != "0" {
        return Some(Err(format!(
            "names database {path}; a Redis Cluster has only database 0: drop the path"
        )));
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{userinfo}{h}/{query}"))
        .collect();
    if nodes.is_empty() {
        return Some(Err(
            "names no node; list one or more, for example redis+cluster://10.0.0.1:6379,10.0.0.2:6379/".into(),
        ));
    }
    Some(Ok(nodes))
}

/// The query of a URL's tail (`/path?k=v`) with its secrets hidden.
fn redact_url_query(tail: &str) -> String {
    if !tail.contains('?') {
        return tail.to_owned();
    }
    let r = redact_url(&format!("redis://h{tail}"));
    r.strip_prefix("redis://h")
        .unwrap_or("?<hidden>")
        .to_owned()
}

/// Every URL in `text` (a `scheme://` up to the closing quote, or the end
/// of the word when unquoted) redacted with [`redact_url`]: for messages
/// that quote configuration text, such as a TOML syntax error's snippet
/// of the `url` line.
pub(crate) fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
            .map_or(0, |i| i + 1);
        let quote = rest[..start]
            .chars()
            .next_back()
            .filter(|c| *c == '"' || *c == '\'');
        let after = &rest[at..];
        let len = match quote {
            Some(q) => after.find([q, '\n']),
            None => after.find(|c: char| c.is_whitespace() || c == '"' || c == '\''),
        }
        .unwrap_or(after.len());
        let end = at + len;
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}
