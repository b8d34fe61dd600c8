//! The store's Redis front: the RESP2 commands `redis-cli`, the `redis` Python client and
//! LMCache's Redis connector send a key-value server, answered as Redis answers them
//! (its replies and its error words, checked against Debian's redis-server in
//! `tests/redis_parity.rs`).
//!
//! Commands: PING, ECHO, AUTH, HELLO (2, or 3: RESP3's nil and maps, which the `redis`
//! Python client asks for from version 8), SELECT 0, QUIT, GET, SET (NX, XX,
//! GET), MGET, MSET, EXISTS, DEL and UNLINK, DBSIZE, FLUSHDB and FLUSHALL, INFO, CLIENT
//! (SETNAME, GETNAME, SETINFO, ID), COMMAND (COUNT, DOCS), and MULTI, EXEC and DISCARD
//! (the `redis` Python client's pipelines are transactions: an EXEC runs its commands
//! with no other client's in between); and kvtwin's own batched command for its
//! connector, KVTWIN.PREFIX key..., the number of leading keys held (a prompt's blocks
//! in order: how far its prefix is in the store), with MGET and MSET as its batched
//! get and put; and KVTWIN.TIER key, the tier that holds it (`memory`, `disk`,
//! `object`, or nil), for checks of what a restart must keep. Not: WATCH, expiry (SET's EX, PX,
//! EXAT, PXAT, KEEPTTL are refused by name: the store's tiers evict, nothing expires),
//! other databases, data types other than strings.
//!
//! With a token (Redis's `requirepass`), every command but AUTH, HELLO and QUIT is
//! refused until the connection has sent it. Connections are bounded; a request over
//! the protocol's bounds ends its connection with Redis's protocol error.
//!
//! Owns: connections, the commands and their replies. Never: the store's tiers (it asks
//! [`Store`]).

use crate::pages::Value;
use crate::resp::{next_request, Limits, Output, Reply};
use crate::store::{Store, StoreError};
use bytes::{Bytes, BytesMut};
use kvtwin_plane::service::tls::HANDSHAKE_TIMEOUT;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{RwLock, Semaphore};
use tokio_rustls::TlsAcceptor;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The password clients give AUTH; `None`: no authentication.
    pub token: Option<String>,
    /// Connections served at once; more wait to be accepted.
    pub max_clients: usize,
    /// Bounds on one request.
    pub limits: Limits,
    /// TLS (Redis's `tls-port`, `rediss://` to clients): each connection's handshake
    /// first, on its own task within [`HANDSHAKE_TIMEOUT`]; `None`: plain TCP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// The Redis version the server says it speaks (INFO, HELLO): the commands above as
/// Redis 7.0 answers them.
pub const REDIS_VERSION: &str = "7.0.0";

/// Serves `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, store: Arc<Store>, config: ServerConfig) {
    let config = Arc::new(config);
    // Commands share it; an EXEC holds it alone.
    let exclusive = Arc::new(RwLock::new(()));
    let slots = Arc::new(Semaphore::new(config.max_clients.max(1)));
    let ids = Arc::new(AtomicU64::new(1));
    let acceptor = config.tls.clone().map(TlsAcceptor::from);
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "kvtwin store: accept failed");
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let (store, config, exclusive) = (store.clone(), config.clone(), exclusive.clone());
        let id = ids.fetch_add(1, Ordering::Relaxed);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            // The handshake holds this connection's slot, never the accept loop.
            let served = match acceptor {
                None => connection(socket, store, &config, &exclusive, id).await,
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                        Ok(Ok(tls)) => connection(tls, store, &config, &exclusive, id).await,
                        Ok(Err(error)) => Err(error),
                        Err(_) => Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the TLS handshake did not finish in time",
                        )),
                    }
                }
            };
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "kvtwin store: connection ended");
            }
            drop(permit);
        });
    }
}

/// One client's state.
struct Client {
    id: u64,
    name: Option<Bytes>,
    authenticated: bool,
    /// Inside MULTI: the commands queued, and whether one was refused (then EXEC aborts).
    queued: Option<(Vec<Vec<Bytes>>, bool)>,
    /// Whether it asked for RESP3 (HELLO 3).
    resp3: bool,
}

/// Writes `parts` in order, as many at a time as the socket takes (one system call for
/// a reply's header and its value).
async fn write_parts(
    socket: &mut (impl AsyncWrite + Unpin),
    parts: Vec<Bytes>,
) -> std::io::Result<()> {
    let (mut part, mut offset) = (0, 0);
    while part < parts.len() {
        let slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&parts[part][offset..])
            .chain(parts[part + 1..].iter().map(|p| &p[..]))
            .take(64)
            .map(std::io::IoSlice::new)
            .collect();
        let mut written = socket.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while part < parts.len() && written >= parts[part].len() - offset {
            written -= parts[part].len() - offset;
            (part, offset) = (part + 1, 0);
        }
        offset += written;
    }
    Ok(())
}

async fn connection(
    mut socket: impl AsyncRead + AsyncWrite + Unpin,
    store: Arc<Store>,
    config: &ServerConfig,
    exclusive: &RwLock<()>,
    id: u64,
) -> std::io::Result<()> {
    let mut client = Client {
        id,
        name: None,
        authenticated: config.token.is_none(),
        queued: None,
        resp3: false,
    };
    let mut input = BytesMut::with_capacity(16 << 10);
    let mut output = Output::default();
    loop {
        if socket.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
        // Every whole request read, answered in order (pipelining), then written at once.
        let mut quit = false;
        loop {
            match next_request(&mut input, &config.limits) {
                Ok(Some(args)) if args.is_empty() => continue,
                Ok(Some(args)) => {
                    let (reply, last) =
                        transaction(&store, config, exclusive, &mut client, args).await;
                    reply.encode_to(&mut output, client.resp3);
                    if last {
                        quit = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    Reply::err(error).encode_to(&mut output, false);
                    quit = true;
                    break;
                }
            }
        }
        write_parts(&mut socket, output.take()).await?;
        if quit {
            return socket.shutdown().await;
        }
    }
}

/// MULTI, EXEC and DISCARD, and every other command queued inside a transaction or run
/// at once outside one; whether the connection ends after it.
async fn transaction(
    store: &Store,
    config: &ServerConfig,
    exclusive: &RwLock<()>,
    client: &mut Client,
    args: Vec<Bytes>,
) -> (Reply, bool) {
    let name = String::from_utf8_lossy(&args[0]).to_lowercase();
    let inside = client.queued.is_some();
    let reply = match name.as_str() {
        "multi" if !client.authenticated => Reply::Error("NOAUTH Authentication required.".into()),
        "multi" if inside => Reply::err("MULTI calls can not be nested"),
        "multi" => {
            client.queued = Some((Vec::new(), false));
            Reply::Simple("OK")
        }
        "exec" | "discard" if !inside => {
            Reply::err(format!("{} without MULTI", name.to_uppercase()))
        }
        "discard" => {
            client.queued = None;
            Reply::Simple("OK")
        }
        "exec" => {
            let (queued, refused) = client.queued.take().unwrap_or_default();
            if refused {
                return (
                    Reply::Error(
                        "EXECABORT Transaction discarded because of previous errors.".into(),
                    ),
                    false,
                );
            }
            let _alone = exclusive.write().await;
            let mut replies = Vec::with_capacity(queued.len());
            for args in &queued {
                replies.push(command(store, config, client, args).await.0);
            }
            Reply::Array(replies)
        }
        "quit" => return command(store, config, client, &args).await,
        _ if inside => {
            let refusal = if client.authenticated {
                refusal(&name, &args)
            } else {
                Some(Reply::Error("NOAUTH Authentication required.".into()))
            };
            let (queued, refused) = client.queued.as_mut().expect("inside a transaction");
            match refusal {
                Some(reply) => {
                    *refused = true;
                    reply
                }
                None => {
                    queued.push(args);
                    Reply::Simple("QUEUED")
                }
            }
        }
        _ => {
            let _shared = exclusive.read().await;
            return command(store, config, client, &args).await;
        }
    };
    (reply, false)
}

/// Why Redis would refuse to queue `args` (`name` lower-cased): an unknown command or
/// the wrong number of arguments for it.
fn refusal(name: &str, args: &[Bytes]) -> Option<Reply> {
    let n = args.len();
    let fits = match name {
        "get" | "echo" | "select" | "kvtwin.tier" => n == 2,
        "set" | "mset" => n >= 3,
        "mget" | "exists" | "del" | "unlink" | "client" | "kvtwin.prefix" => n >= 2,
        "ping" | "flushdb" | "flushall" => n <= 2,
        "dbsize" => n == 1,
        "auth" => (2..=3).contains(&n),
        "info" | "command" | "hello" => true,
        _ => return Some(unknown(&args[0], &args[1..])),
    };
    (!fits).then(|| wrong_arity(name))
}

fn wrong_arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

fn syntax() -> Reply {
    Reply::err("syntax error")
}

fn store_error(error: StoreError) -> Reply {
    match error {
        StoreError::Full(_) => Reply::Error(format!("OOM kvtwin store: {error}")),
        error => Reply::err(format!("kvtwin store: {error}")),
    }
}

/// Answers one command; whether the connection ends after it.
async fn command(
    store: &Store,
    config: &ServerConfig,
    client: &mut Client,
    args: &[Bytes],
) -> (Reply, bool) {
    let name = String::from_utf8_lossy(&args[0]).to_lowercase();
    let rest = &args[1..];
    if !client.authenticated && !matches!(name.as_str(), "auth" | "hello" | "quit") {
        return (
            Reply::Error("NOAUTH Authentication required.".into()),
            false,
        );
    }
    let reply = match name.as_str() {
        "ping" => match rest {
            [] => Reply::Simple("PONG"),
            [message] => Reply::bulk(message.clone()),
            _ => wrong_arity(&name),
        },
        "echo" => match rest {
            [message] => Reply::bulk(message.clone()),
            _ => wrong_arity(&name),
        },
        "quit" => return (Reply::Simple("OK"), true),
        "auth" => match rest {
            [password] | [_, password] if rest.len() == 1 || rest[0].as_ref() == b"default" => {
                auth(config, client, password)
            }
            [_, _] => wrong_password(),
            _ => wrong_arity(&name),
        },
        "hello" => hello(config, client, rest),
        "select" => match rest {
            [index] if index.as_ref() == b"0" => Reply::Simple("OK"),
            [index] if std::str::from_utf8(index).is_ok_and(|t| t.parse::<i64>().is_ok()) => {
                Reply::err("DB index is out of range")
            }
            [_] => Reply::err("value is not an integer or out of range"),
            _ => wrong_arity(&name),
        },
        "get" => match rest {
            [key] => Reply::Bulk(store.get(key).await),
            _ => wrong_arity(&name),
        },
        "set" => set(store, rest).await,
        "mget" => match rest {
            [] => wrong_arity(&name),
            keys => {
                let mut values = Vec::with_capacity(keys.len());
                for key in keys {
                    values.push(Reply::Bulk(store.get(key).await));
                }
                Reply::Array(values)
            }
        },
        "mset" => {
            if rest.is_empty() || rest.len() % 2 == 1 {
                wrong_arity(&name)
            } else {
                let mut reply = Reply::Simple("OK");
                for pair in rest.chunks(2) {
                    if let Err(error) = store.put(pair[0].clone(), pair[1].clone()).await {
                        reply = store_error(error);
                        break;
                    }
                }
                reply
            }
        }
        "exists" => match rest {
            [] => wrong_arity(&name),
            keys => {
                let mut found = 0;
                for key in keys {
                    found += i64::from(store.contains(key).await);
                }
                Reply::Integer(found)
            }
        },
        "kvtwin.tier" => match rest {
            [key] => Reply::Bulk(
                store
                    .tier_of(key)
                    .await
                    .map(|tier| Bytes::from_static(tier.name().as_bytes()).into()),
            ),
            _ => wrong_arity(&name),
        },
        "kvtwin.prefix" => match rest {
            [] => wrong_arity(&name),
            keys => {
                let mut held = 0;
                for key in keys {
                    if !store.contains(key).await {
                        break;
                    }
                    held += 1;
                }
                Reply::Integer(held)
            }
        },
        "del" | "unlink" => match rest {
            [] => wrong_arity(&name),
            keys => {
                let mut deleted = 0;
                for key in keys {
                    deleted += i64::from(store.delete(key).await);
                }
                Reply::Integer(deleted)
            }
        },
        "dbsize" => match rest {
            [] => Reply::Integer(store.occupancy().await.keys as i64),
            _ => wrong_arity(&name),
        },
        "flushdb" | "flushall" => match rest {
            [] => {
                store.clear().await;
                Reply::Simple("OK")
            }
            [mode] if mode.eq_ignore_ascii_case(b"sync") || mode.eq_ignore_ascii_case(b"async") => {
                store.clear().await;
                Reply::Simple("OK")
            }
            _ => syntax(),
        },
        "info" => Reply::bulk(info(store).await),
        "client" => client_command(client, rest),
        // `redis-cli` asks COMMAND DOCS for its hints: none to give.
        "command" => match rest.first().map(|s| s.to_ascii_lowercase()).as_deref() {
            Some(b"count") => Reply::Integer(COMMANDS.len() as i64),
            // A map of command to its docs: in RESP3 an empty map, as Redis gives.
            Some(b"docs") => Reply::Map(Vec::new()),
            _ => Reply::Array(Vec::new()),
        },
        _ => unknown(&args[0], rest),
    };
    (reply, false)
}

/// The commands the server knows, for COMMAND COUNT.
const COMMANDS: [&str; 21] = [
    "ping",
    "echo",
    "quit",
    "auth",
    "hello",
    "select",
    "get",
    "set",
    "mget",
    "mset",
    "exists",
    "del",
    "unlink",
    "dbsize",
    "flushdb",
    "flushall",
    "info",
    "client",
    "command",
    "kvtwin.prefix",
    "kvtwin.tier",
];

fn wrong_password() -> Reply {
    Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
}

fn auth(config: &ServerConfig, client: &mut Client, password: &[u8]) -> Reply {
    use subtle::ConstantTimeEq;
    match &config.token {
        None => Reply::err(
            "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ),
        Some(token) if bool::from(token.as_bytes().ct_eq(password)) => {
            client.authenticated = true;
            Reply::Simple("OK")
        }
        Some(_) => wrong_password(),
    }
}

/// HELLO [2 [AUTH user pass] [SETNAME name]]: RESP2 only.
fn hello(config: &ServerConfig, client: &mut Client, rest: &[Bytes]) -> Reply {
    let mut at = 0;
    let mut protocol = if client.resp3 { 3 } else { 2 };
    if let Some(version) = rest.first() {
        match std::str::from_utf8(version)
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
        {
            Some(version @ (2 | 3)) => {
                at = 1;
                protocol = version;
            }
            Some(_) => return Reply::Error("NOPROTO unsupported protocol version".into()),
            None => return Reply::err("Protocol version is not an integer or out of range"),
        }
    }
    while at < rest.len() {
        let option = rest[at].to_ascii_lowercase();
        if option == b"auth" && at + 2 < rest.len() {
            let reply = auth(config, client, &rest[at + 2]);
            if !matches!(reply, Reply::Simple(_)) {
                return reply;
            }
            at += 3;
        } else if option == b"setname" && at + 1 < rest.len() {
            client.name = Some(rest[at + 1].clone());
            at += 2;
        } else {
            return Reply::err(format!(
                "Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(&rest[at])
            ));
        }
    }
    if !client.authenticated {
        return Reply::Error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".into(),
        );
    }
    // The reply, and every one after it, in the protocol asked for.
    client.resp3 = protocol == 3;
    let text = |s: &str| Reply::bulk(Bytes::copy_from_slice(s.as_bytes()));
    Reply::Map(vec![
        text("server"),
        text("redis"),
        text("version"),
        text(REDIS_VERSION),
        text("proto"),
        Reply::Integer(protocol),
        text("id"),
        Reply::Integer(client.id as i64),
        text("mode"),
        text("standalone"),
        text("role"),
        text("master"),
        text("modules"),
        Reply::Array(Vec::new()),
    ])
}

/// SET key value [NX|XX] [GET].
async fn set(store: &Store, rest: &[Bytes]) -> Reply {
    let [key, value, options @ ..] = rest else {
        return wrong_arity("set");
    };
    let (mut nx, mut xx, mut get) = (false, false, false);
    for option in options {
        match option.to_ascii_lowercase().as_slice() {
            b"nx" if !xx => nx = true,
            b"xx" if !nx => xx = true,
            b"get" => get = true,
            b"ex" | b"px" | b"exat" | b"pxat" | b"keepttl" => {
                return Reply::err(
                    "kvtwin store keeps no expiry (EX, PX, EXAT, PXAT, KEEPTTL): its tiers evict least recently used first",
                )
            }
            _ => return syntax(),
        }
    }
    let old = if get { store.get(key).await } else { None };
    // Only NX and XX ask whether the key is there (GET has read it already).
    let exists = if get {
        old.is_some()
    } else if nx || xx {
        store.contains(key).await
    } else {
        false
    };
    if (nx && exists) || (xx && !exists) {
        return Reply::Bulk(if get { old } else { None });
    }
    match store.put(key.clone(), value.clone()).await {
        Ok(_) if get => Reply::Bulk(old),
        Ok(_) => Reply::Simple("OK"),
        Err(error) => store_error(error),
    }
}

fn client_command(client: &mut Client, rest: &[Bytes]) -> Reply {
    let Some(sub) = rest.first() else {
        return wrong_arity("client");
    };
    match (sub.to_ascii_lowercase().as_slice(), &rest[1..]) {
        (b"setname", [name]) => {
            client.name = (!name.is_empty()).then(|| name.clone());
            Reply::Simple("OK")
        }
        (b"getname", []) => Reply::Bulk(client.name.clone().map(Value::from)),
        (b"setinfo", [_, _]) => Reply::Simple("OK"),
        (b"id", []) => Reply::Integer(client.id as i64),
        (b"setname" | b"getname" | b"setinfo" | b"id", _) => Reply::err(format!(
            "wrong number of arguments for 'client|{}' command",
            String::from_utf8_lossy(sub).to_lowercase()
        )),
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

/// Redis's words for a command it does not know.
fn unknown(name: &Bytes, rest: &[Bytes]) -> Reply {
    let mut text = format!(
        "unknown command '{}', with args beginning with: ",
        String::from_utf8_lossy(name)
    );
    for arg in rest {
        text.push_str(&format!("'{}' ", String::from_utf8_lossy(arg)));
    }
    Reply::err(text)
}

async fn info(store: &Store) -> String {
    let occupancy = store.occupancy().await;
    let counters = &store.counters;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let mut text = format!(
        "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:standalone\r\nkvtwin_store:{}\r\n\r\n# Stats\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\nevicted_keys:{}\r\n\r\n# Tiers\r\n",
        env!("CARGO_PKG_VERSION"),
        counters.hits.iter().map(load).sum::<u64>(),
        load(&counters.misses),
        counters.evictions.iter().map(load).sum::<u64>(),
    );
    for (tier, (keys, used, limit)) in crate::index::Tier::ALL.iter().zip(occupancy.tiers) {
        text.push_str(&format!(
            "{}:keys={keys},used_bytes={used},max_bytes={limit}\r\n",
            tier.name()
        ));
    }
    text.push_str(&format!(
        "leased_copies:{}\r\nleases_total:{}\r\npromotions:{}\r\ndemotions:{}\r\ncorrupt_values:{}\r\n",
        occupancy.leased,
        load(&counters.leases),
        load(&counters.promotions),
        counters.demotions.iter().map(load).sum::<u64>(),
        load(&counters.corrupt)
    ));
    let pages = store.page_counts();
    text.push_str(&format!(
        "value_page_bytes:{}\r\nvalue_pages_made:{}\r\nvalue_pages_reused:{}\r\nvalue_pages_released:{}\r\nvalue_pages_free:{}\r\n\r\n# Keyspace\r\n",
        crate::pages::PAGE,
        pages.made,
        pages.reused,
        pages.released,
        pages.free
    ));
    if let Some(events) = store.events() {
        let c = &events.counters;
        text.insert_str(
            text.len() - "# Keyspace\r\n".len(),
            &format!(
                "# Events\r\nannounced_blocks:{}\r\nkv_events_stored:{}\r\nkv_events_removed:{}\r\nnon_block_values:{}\r\n",
                occupancy.announced_blocks,
                load(&c.stored),
                load(&c.removed),
                load(&c.non_block_values),
            ),
        );
        let mut transports = String::new();
        for (name, t) in events.transports() {
            transports.push_str(&format!(
                "kv_events_{name}:published={},dropped={},errors={}\r\n",
                load(&t.published),
                load(&t.dropped),
                load(&t.errors)
            ));
        }
        text.insert_str(
            text.len() - "# Keyspace\r\n".len(),
            &format!("{transports}\r\n"),
        );
    }
    if occupancy.keys > 0 {
        text.push_str(&format!(
            "db0:keys={},expires=0,avg_ttl=0\r\n",
            occupancy.keys
        ));
    }
    text
}
