//! A TCP relay in front of an API server, as a load balancer or a network
//! path: it can be partitioned (silent both ways) and counts connections.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use multicluster_core::lock;
use multicluster_runtime::testing::Changes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// A relay on loopback to `upstream` that forwards bytes both ways until
/// partitioned: then it reads what arrives but forwards nothing, keeping
/// every connection open, until healed. It counts the connections made
/// to it.
pub struct Relay {
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    partitioned: watch::Sender<bool>,
    accepting: tokio::task::JoinHandle<()>,
    /// When each connection came (every attempt to reach the server).
    connections: Arc<Mutex<Vec<(Instant, SystemTime)>>>,
    /// Told at every connection.
    pub connected: Changes,
}

impl Relay {
    /// A relay to `upstream`, forwarding.
    pub async fn start(upstream: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let (partitioned, _) = watch::channel(false);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let connected = Changes::default();
        let accepting = tokio::spawn({
            let partitioned = partitioned.clone();
            let (connections, connected) = (connections.clone(), connected.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    lock(&connections).push((Instant::now(), SystemTime::now()));
                    connected.tell();
                    // A server that is gone: the connection is dropped, as
                    // a load balancer in front of it would.
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::spawn(forward(client_read, server_write, partitioned.subscribe()));
                    tokio::spawn(forward(server_read, client_write, partitioned.subscribe()));
                }
            }
        });
        Self {
            port,
            partitioned,
            accepting,
            connections,
            connected,
        }
    }

    /// Stops forwarding (`true`) or forwards again.
    pub fn partition(&self, on: bool) {
        self.partitioned.send_replace(on);
    }

    /// The connections that came since `from`: when, on both clocks.
    pub fn connections_since(&self, from: Instant) -> Vec<(Instant, SystemTime)> {
        lock(&self.connections)
            .iter()
            .filter(|(at, _)| *at >= from)
            .copied()
            .collect()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Copies `from` to `to`, holding each chunk back while partitioned; the
/// halves stay open either way.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut partitioned: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if partitioned.wait_for(|on| !on).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
