//! The board: a page for the people watching a swarm, served on the hub's port at `/`
//! (HTML, CSS and JavaScript in `crates/hub/web/`, compiled into the binary; nothing
//! is fetched from elsewhere). It is a client of the JSON API like any other: the list
//! index, each list's event stream (resumed from its last event id after a reconnect),
//! and the same calls, with the same checks, for what a lead does from it. The page
//! itself carries no data: it is served to anyone who can reach the port.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{
    HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_SECURITY_POLICY, CONTENT_TYPE,
    X_CONTENT_TYPE_OPTIONS,
};
use hyper::Response;

/// Paths of the board's assets other than `/` start with this.
pub(crate) const PREFIX: &str = "/board.";

/// One file of the board.
#[derive(Debug)]
pub(crate) struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const ASSETS: [Asset; 3] = [
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../web/index.html"),
    },
    Asset {
        path: "/board.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../web/board.css"),
    },
    Asset {
        path: "/board.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../web/board.js"),
    },
];

/// The asset at `path`, if the board has one there.
pub(crate) fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

/// The page may load only its own files and talk only to this hub.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

/// The asset's response (`HEAD`: the headers alone).
pub(crate) fn response(asset: &Asset, head: bool) -> Response<Full<Bytes>> {
    let body = if head { "" } else { asset.body };
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    h.insert(CONTENT_LENGTH, HeaderValue::from(asset.body.len()));
    // Revalidated on every load: a hub upgraded serves its new page at once.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    r
}
