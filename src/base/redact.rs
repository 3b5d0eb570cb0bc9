//! Credentials inside URLs (`https://user:password@host/...`) never reach a log line, an error
//! message, a status page or `--print-config`: every URL that may be shown goes through
//! `redact_url` first.

/// What replaces the user information of a URL.
pub const REDACTED: &str = "<redacted>";

/// `url` with its user information (everything between `://` and the authority's last `@`)
/// replaced by `<redacted>`; anything without user information is returned as it is.
pub fn redact_url(url: &str) -> std::borrow::Cow<'_, str> {
    let Some(scheme_end) = url.find("://") else { return url.into() };
    let authority_start = scheme_end + 3;
    let authority_len = url[authority_start..].find(['/', '?', '#']).unwrap_or(url.len() - authority_start);
    let authority = &url[authority_start..authority_start + authority_len];
    match authority.rfind('@') {
        Some(at) => format!("{}{REDACTED}{}", &url[..authority_start], &url[authority_start + at..]).into(),
        None => url.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_information_is_replaced_and_the_rest_kept() {
        assert_eq!(redact_url("https://key:secret@s3.example.com/bucket"), "https://<redacted>@s3.example.com/bucket");
        assert_eq!(
            redact_url("wss://user@jet.example/subscribe?x=a@b"),
            "wss://<redacted>@jet.example/subscribe?x=a@b"
        );
        assert_eq!(redact_url("https://a:b@c@host:9"), "https://<redacted>@host:9");
        assert_eq!(redact_url("https://pds.example.com/xrpc/x?did=a@b"), "https://pds.example.com/xrpc/x?did=a@b");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
