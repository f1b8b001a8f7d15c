//! The web run viewer: a page served by `heddle serve` itself, so watching a run needs
//! nothing but a browser. Its assets are compiled into the binary (no build step, no
//! CDN, nothing fetched from the network) and need no token: they hold no data. Every
//! request the page makes for data goes to the API with the bearer token, which the
//! page keeps in `sessionStorage` and never puts in a URL a server would log.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// One embedded file: its path under `/`, content type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const JS: &str = "text/javascript; charset=utf-8";

const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("assets/index.html"),
    },
    Asset {
        path: "/viewer/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/style.css"),
    },
    Asset {
        path: "/viewer/app.js",
        content_type: JS,
        body: include_str!("assets/app.js"),
    },
    Asset {
        path: "/viewer/api.js",
        content_type: JS,
        body: include_str!("assets/api.js"),
    },
    Asset {
        path: "/viewer/graph.js",
        content_type: JS,
        body: include_str!("assets/graph.js"),
    },
    Asset {
        path: "/viewer/state.js",
        content_type: JS,
        body: include_str!("assets/state.js"),
    },
    Asset {
        path: "/viewer/run.js",
        content_type: JS,
        body: include_str!("assets/run.js"),
    },
];

/// The page and its assets, outside the API's token check.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS.iter().fold(Router::new(), |r, a| {
        r.route(
            a.path,
            get(move || async move {
                (
                    [
                        (header::CONTENT_TYPE, a.content_type),
                        // The page must not run anything but its own files, and its
                        // token must not leave it in a Referer.
                        (
                            header::CONTENT_SECURITY_POLICY,
                            "default-src 'self'; img-src 'self' blob: data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
                        ),
                        (header::REFERRER_POLICY, "no-referrer"),
                        (header::CACHE_CONTROL, "no-cache"),
                    ],
                    a.body,
                )
                    .into_response()
            }),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    /// Every file the page names (the HTML's `/viewer/…` links, the modules' `./x.js`
    /// imports) is one the server serves: a module added to the page but not to
    /// `ASSETS` would break the whole page with nothing but a console error.
    #[test]
    fn every_file_the_page_loads_is_served() {
        let served: Vec<&str> = ASSETS.iter().map(|a| a.path).collect();
        let mut named = Vec::new();
        for a in ASSETS {
            for (prefix, dir) in [("\"./", "/viewer/"), ("\"/viewer/", "/viewer/")] {
                for (at, _) in a.body.match_indices(prefix) {
                    let rest = &a.body[at + prefix.len()..];
                    let name = &rest[..rest.find('"').unwrap_or(rest.len())];
                    named.push(format!("{dir}{name}"));
                }
            }
        }
        assert!(named.len() >= 6, "{named:?}");
        for n in &named {
            assert!(served.contains(&n.as_str()), "{n} is named but not served");
        }
        for a in ASSETS.iter().filter(|a| a.path.starts_with("/viewer/")) {
            assert!(
                named.contains(&a.path.to_string()),
                "{} is served but never loaded",
                a.path
            );
        }
    }
}
