//! A loopback TCP proxy that holds every byte back for a fixed time in each direction:
//! `inboxctl bench --pg-delay-ms` puts it between the bench's pools and Postgres, so that a
//! round trip costs what it would on a network (docs/design.md §8).
//!
//! Threads and blocking sockets, not tokio: tokio's timer rounds up to a millisecond, and the
//! delays here are fractions of one. `std::thread::sleep` (nanosleep) wakes a little late, by
//! tens of microseconds on Linux and more on a virtual machine, which the writers allow for
//! (`Lateness`); a sleeping thread costs no CPU.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Each proxy thread only moves buffers (the reads go to the heap): a small stack is plenty.
const STACK: usize = 256 * 1024;

/// The proxy: listening on 127.0.0.1 (a port the kernel picks) and forwarding each accepted
/// connection to `upstream`. Dropping it closes every connection and joins every thread.
pub struct DelayProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    links: Arc<Mutex<Vec<Link>>>,
}

/// One accepted connection: its two sockets and the four threads moving bytes between them.
struct Link {
    client: TcpStream,
    server: TcpStream,
    threads: Vec<JoinHandle<()>>,
}

impl DelayProxy {
    /// Starts forwarding to `upstream`, holding each chunk back `one_way` in each direction.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<Link>>> = Arc::default();
        let lateness = Arc::new(Lateness::default());
        let accept = {
            let (stop, links) = (stop.clone(), links.clone());
            thread::Builder::new()
                .name("pg-delay-accept".into())
                .stack_size(STACK)
                .spawn(move || {
                    for client in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        // A connection that cannot be linked is dropped: its client sees it closed.
                        let linked =
                            client.and_then(|c| Link::open(c, upstream, one_way, lateness.clone()));
                        match linked {
                            Ok(link) => {
                                let mut links =
                                    links.lock().unwrap_or_else(PoisonError::into_inner);
                                links.retain(|l| !l.finished());
                                links.push(link);
                            }
                            Err(e) => {
                                eprintln!("pg-delay: {e}");
                                // Out of descriptors, say: no spinning on the same error.
                                thread::sleep(Duration::from_millis(10));
                            }
                        }
                    }
                })?
        };
        Ok(Self {
            addr,
            stop,
            accept: Some(accept),
            links,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The accept is blocking: a connection of our own wakes it to see the flag. If that
        // cannot connect, the thread is left to end with the process rather than waited on.
        let woken = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok();
        if let (true, Some(accept)) = (woken, self.accept.take()) {
            let _ = accept.join();
        }
        let links = std::mem::take(&mut *self.links.lock().unwrap_or_else(PoisonError::into_inner));
        for link in links {
            link.close();
        }
    }
}

impl Link {
    fn open(
        client: TcpStream,
        upstream: SocketAddr,
        one_way: Duration,
        lateness: Arc<Lateness>,
    ) -> io::Result<Self> {
        let server = TcpStream::connect(upstream)?;
        // Each chunk is written as soon as its time comes, not held for a fuller segment.
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let threads = pipe(&client, &server, one_way, lateness.clone()).and_then(|mut threads| {
            threads.extend(pipe(&server, &client, one_way, lateness)?);
            Ok(threads)
        });
        match threads {
            Ok(threads) => Ok(Self {
                client,
                server,
                threads,
            }),
            Err(e) => {
                // Threads of one direction may have started: closing the sockets ends them.
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                Err(e)
            }
        }
    }

    fn finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Shuts both sockets, which ends a blocked read or write, and waits for the threads
    /// (a writer asleep wakes within one delay).
    fn close(self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// How late `thread::sleep` wakes on this machine, on average over the proxy's recent sleeps:
/// each writer sleeps that much less than the time left, so that a chunk's delay holds on
/// average. On a virtual machine the wake-up can come 100–150 µs late, which at 0.2 ms each
/// way would add half as much again.
#[derive(Default)]
struct Lateness(AtomicU64);

impl Lateness {
    fn sleep_until(&self, deadline: Instant) {
        let now = Instant::now();
        let Some(left) = deadline.checked_duration_since(now) else {
            return;
        };
        let average = self.0.load(Ordering::Relaxed);
        // Less time left than the wake-up would overshoot by: sending now is the closer. The
        // estimate decays meanwhile, so that one that grew too large is sampled again.
        let Some(sleep) = left.checked_sub(Duration::from_nanos(average)) else {
            self.0.store(average - average / 8, Ordering::Relaxed);
            return;
        };
        thread::sleep(sleep);
        // A thread descheduled for long says little about the timer: capped.
        let late = now
            .elapsed()
            .saturating_sub(sleep)
            .min(Duration::from_micros(500));
        let average = average - average / 8 + late.as_nanos() as u64 / 8;
        self.0.store(average, Ordering::Relaxed);
    }
}

/// Moves bytes from `from` to `to`, each chunk `delay` after it arrived. A reader queues
/// (deadline, bytes) and a writer sleeps until each deadline, so pipelined chunks wait their
/// own delay side by side, not one after another, and stay in order.
fn pipe(
    from: &TcpStream,
    to: &TcpStream,
    delay: Duration,
    lateness: Arc<Lateness>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut source = from.try_clone()?;
    let reader = thread::Builder::new()
        .name("pg-delay-read".into())
        .stack_size(STACK)
        .spawn(move || {
            let mut buf = vec![0; 64 * 1024];
            // The end of the stream, or an error, drops the sender: the writer sends what is
            // queued and then closes its side.
            loop {
                let n = match source.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => return,
                };
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    return;
                }
            }
        })?;
    let (mut sink, source) = (to.try_clone()?, from.try_clone()?);
    let writer = thread::Builder::new()
        .name("pg-delay-write".into())
        .stack_size(STACK)
        .spawn(move || {
            for (deadline, bytes) in rx {
                lateness.sleep_until(deadline);
                if sink.write_all(&bytes).is_err() {
                    // The receiving side is gone: close the sending side too, which ends
                    // this direction's reader.
                    let _ = sink.shutdown(Shutdown::Both);
                    let _ = source.shutdown(Shutdown::Both);
                    return;
                }
            }
            // The sender closed its side: pass the close on, as the one end closing tells
            // the other.
            let _ = sink.shutdown(Shutdown::Write);
        })?;
    Ok(vec![reader, writer])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proxy with a delay in front of a listener of the test's own; returns the proxy, the
    /// client's end and the server's end of one connection through it.
    fn linked(one_way: Duration) -> (DelayProxy, TcpStream, TcpStream) {
        let upstream = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let proxy = DelayProxy::start(upstream.local_addr().unwrap(), one_way).unwrap();
        let client = TcpStream::connect(proxy.addr()).unwrap();
        let (server, _) = upstream.accept().unwrap();
        for end in [&client, &server] {
            // A hang fails the test instead of stalling it; small writes leave one by one.
            end.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            end.set_nodelay(true).unwrap();
        }
        (proxy, client, server)
    }

    fn payload(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn bytes_go_through_both_ways_in_order() {
        let (_proxy, mut client, mut server) = linked(Duration::from_micros(500));
        // Larger than one read's buffer, and than a socket's buffer: written from a thread
        // of its own while the other end reads.
        let large = payload(1 << 20, 7);
        let writer = {
            let (mut client, large) = (client.try_clone().unwrap(), large.clone());
            thread::spawn(move || client.write_all(&large).unwrap())
        };
        let mut got = vec![0; large.len()];
        server.read_exact(&mut got).unwrap();
        writer.join().unwrap();
        assert!(got == large, "the large payload arrives whole and in order");

        let answer = payload(200 * 1024, 3);
        let writer = {
            let (mut server, answer) = (server.try_clone().unwrap(), answer.clone());
            thread::spawn(move || server.write_all(&answer).unwrap())
        };
        let mut got = vec![0; answer.len()];
        client.read_exact(&mut got).unwrap();
        writer.join().unwrap();
        assert!(got == answer, "the answer arrives whole and in order");
    }

    #[test]
    fn many_small_pipelined_writes_arrive_in_order() {
        let (_proxy, mut client, mut server) = linked(Duration::from_micros(500));
        let messages: Vec<Vec<u8>> = (0..2000u32)
            .map(|n| format!("message {n};").into_bytes())
            .collect();
        // Every write before any read: the chunks are in flight together.
        for m in &messages {
            client.write_all(m).unwrap();
        }
        let expected = messages.concat();
        let mut got = vec![0; expected.len()];
        server.read_exact(&mut got).unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            String::from_utf8(expected).unwrap()
        );

        for m in &messages {
            server.write_all(m).unwrap();
        }
        let expected = messages.concat();
        let mut got = vec![0; expected.len()];
        client.read_exact(&mut got).unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            String::from_utf8(expected).unwrap()
        );
    }

    #[test]
    fn closing_the_client_closes_the_server_side() {
        let (_proxy, mut client, mut server) = linked(Duration::from_micros(500));
        client.write_all(b"last words").unwrap();
        drop(client);
        let mut got = Vec::new();
        server.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"last words", "what was sent arrives, then the end");
    }

    #[test]
    fn closing_the_server_closes_the_client_side() {
        let (_proxy, mut client, mut server) = linked(Duration::from_micros(500));
        server.write_all(b"goodbye").unwrap();
        drop(server);
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"goodbye", "what was sent arrives, then the end");
    }

    #[test]
    fn dropping_the_proxy_closes_its_connections_and_ends_its_threads() {
        let (proxy, mut client, mut server) = linked(Duration::from_micros(500));
        let addr = proxy.addr();
        drop(proxy);
        let mut rest = Vec::new();
        assert_eq!(client.read_to_end(&mut rest).unwrap(), 0);
        assert_eq!(server.read_to_end(&mut rest).unwrap(), 0);
        assert!(
            TcpStream::connect(addr).is_err(),
            "the listener is gone with the proxy"
        );
    }
}
