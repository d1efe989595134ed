//! Who may use the page: nobody but loopback clients, a bearer token, or
//! basic credentials; and the `Host` check that keeps other sites out of
//! an unauthenticated page.

use std::path::Path;

use axum::http::{HeaderMap, header};
use base64::Engine as _;

use crate::WebError;

/// The environment variable holding the bearer token.
pub const TOKEN_ENV: &str = "CONVOY_WEB_TOKEN";
/// The environment variable holding basic credentials, `user:password`.
pub const BASIC_ENV: &str = "CONVOY_WEB_BASIC";

/// How requests authenticate.
#[derive(Clone, Default)]
pub enum Auth {
    /// No authentication: for a loopback address only.
    #[default]
    None,
    /// `Authorization: Bearer TOKEN`; a browser sends it as the password of
    /// basic credentials (any user name, recorded as the operator).
    Token(String),
    /// Basic credentials: `(user, password)` pairs; the user is recorded
    /// as the operator.
    Basic(Vec<(String, String)>),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Token(_) => f.write_str("Token(***)"),
            Auth::Basic(users) => f
                .debug_tuple("Basic")
                .field(&users.iter().map(|(u, _)| u.as_str()).collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl Auth {
    /// The token of `token_file` (its first line), else of
    /// `$CONVOY_WEB_TOKEN`; the credentials of `basic_file` (one
    /// `user:password` a line), else of `$CONVOY_WEB_BASIC`; else none.
    /// A token and basic credentials together are refused, as is an empty
    /// one.
    pub fn from_sources(
        token_file: Option<&Path>,
        basic_file: Option<&Path>,
    ) -> Result<Auth, WebError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .map_err(|e| WebError::Credentials(format!("cannot read {}: {e}", p.display())))
        };
        let token = match token_file {
            Some(p) => Some((
                read(p)?.lines().next().unwrap_or("").trim().to_owned(),
                p.display().to_string(),
            )),
            None => std::env::var(TOKEN_ENV)
                .ok()
                .map(|t| (t.trim().to_owned(), format!("${TOKEN_ENV}"))),
        };
        let basic = match basic_file {
            Some(p) => Some((read(p)?, p.display().to_string())),
            None => std::env::var(BASIC_ENV)
                .ok()
                .map(|b| (b, format!("${BASIC_ENV}"))),
        };
        match (token, basic) {
            (Some(_), Some(_)) => Err(WebError::Credentials(
                "both a token and basic credentials are configured: use one".to_owned(),
            )),
            (Some((token, from)), None) => {
                if token.len() < 16 {
                    return Err(WebError::Credentials(format!(
                        "the token of {from} is shorter than 16 characters"
                    )));
                }
                Ok(Auth::Token(token))
            }
            (None, Some((text, from))) => {
                let mut users = Vec::new();
                for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    match line.split_once(':') {
                        Some((u, p)) if !u.is_empty() && !p.is_empty() => {
                            users.push((u.to_owned(), p.to_owned()));
                        }
                        _ => {
                            return Err(WebError::Credentials(format!(
                                "{from}: each line must be user:password"
                            )));
                        }
                    }
                }
                if users.is_empty() {
                    return Err(WebError::Credentials(format!("{from} holds no user")));
                }
                Ok(Auth::Basic(users))
            }
            (None, None) => Ok(Auth::None),
        }
    }

    /// The operator the request authenticates as: `Some(name)` (empty
    /// when it names none), or `None` when it does not authenticate.
    pub(crate) fn check(&self, headers: &HeaderMap) -> Option<String> {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match self {
            Auth::None => Some(String::new()),
            Auth::Token(token) => match given? {
                h if h.starts_with("Bearer ") => {
                    same(h["Bearer ".len()..].trim(), token).then(String::new)
                }
                h => {
                    let (user, password) = basic(h)?;
                    same(&password, token).then_some(user)
                }
            },
            Auth::Basic(users) => {
                let (user, password) = basic(given?)?;
                // Every pair is compared, whichever matches.
                let mut ok = false;
                for (u, p) in users {
                    ok |= same(&user, u) & same(&password, p);
                }
                ok.then_some(user)
            }
        }
    }
}

/// The user and password of a `Basic` authorization header.
fn basic(header: &str) -> Option<(String, String)> {
    let encoded = header.strip_prefix("Basic ")?.trim();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

/// Compares in a time that does not depend on where the texts differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Whether `host` (a `Host` header) names this machine's loopback
/// interface or is one of `allowed`.
pub(crate) fn host_allowed(host: &str, allowed: &[String]) -> bool {
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
        return true;
    }
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [::1]:8080
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
            .map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(auth).expect("header"),
        );
        h
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn tokens_and_basic_credentials() {
        let t = Auth::Token("0123456789abcdef".into());
        assert_eq!(
            t.check(&headers("Bearer 0123456789abcdef")),
            Some(String::new())
        );
        assert_eq!(t.check(&headers("Bearer 0123456789abcdeX")), None);
        assert_eq!(
            t.check(&headers(&format!("Basic {}", b64("ann:0123456789abcdef")))),
            Some("ann".into())
        );
        assert_eq!(t.check(&HeaderMap::new()), None);
        let b = Auth::Basic(vec![
            ("ann".into(), "pw1".into()),
            ("bob".into(), "pw2".into()),
        ]);
        assert_eq!(
            b.check(&headers(&format!("Basic {}", b64("bob:pw2")))),
            Some("bob".into())
        );
        assert_eq!(
            b.check(&headers(&format!("Basic {}", b64("bob:pw1")))),
            None
        );
        assert_eq!(b.check(&headers("Bearer pw2")), None);
        assert!(format!("{t:?} {b:?}").find("pw").is_none());
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:80",
            "[::1]",
        ] {
            assert!(host_allowed(h, &[]), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1:80",
            "127.0.0.1.evil.example",
        ] {
            assert!(!host_allowed(h, &[]), "{h}");
        }
        assert!(host_allowed(
            "ops.example:8080",
            &["ops.example:8080".into()]
        ));
    }
}
