//! How a delivery is settled, and the coalescing of one batch of settles into frames: the
//! plain rules of the settle task (see `settle.rs` for why acks are coalesced and when a
//! `multiple` ack is safe).

/// What the settle task sends for one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// `basic.ack`: completed, deferred, expired, shed (and failed when a sink dead-lettered it).
    Ack,
    /// `basic.reject(requeue = false)`: to the queue's dead-letter exchange.
    Reject,
    /// `basic.nack(requeue = true)`: not processed, back to the queue.
    Requeue,
}

/// One frame to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Out {
    /// `basic.ack`; with `multiple`, every unsettled tag up to `tag` too.
    Ack {
        tag: u64,
        multiple: bool,
    },
    Reject(u64),
    Requeue(u64),
}

/// Plans one batch of one channel's settles, in decision order (see `settle.rs`).
#[derive(Debug, Default)]
pub(crate) struct Coalescer {
    /// The batch's acks not written yet.
    acks: Vec<u64>,
    /// The highest of them whose tag and every tag below it were settled when it was
    /// decided: one `multiple` ack of it settles every pending ack up to it.
    multiple: Option<u64>,
}

impl Coalescer {
    /// A settle of `tag` decided when every tag below `floor` was settled. Rejects and
    /// requeues are planned at once, acks at [`finish`](Self::finish).
    pub(crate) fn settle(&mut self, tag: u64, how: Settle, floor: u64, outs: &mut Vec<Out>) {
        match how {
            Settle::Ack => {
                self.acks.push(tag);
                if tag < floor && self.multiple.is_none_or(|m| m < tag) {
                    self.multiple = Some(tag);
                }
            }
            Settle::Reject => outs.push(Out::Reject(tag)),
            Settle::Requeue => outs.push(Out::Requeue(tag)),
        }
    }

    /// Plans the pending acks: one `multiple` ack for those up to the coalescing tag (when it
    /// covers more than itself), the others one by one.
    pub(crate) fn finish(&mut self, outs: &mut Vec<Out>) {
        let covered = self
            .multiple
            .map_or(0, |m| self.acks.iter().filter(|&&t| t <= m).count());
        match self.multiple.take() {
            Some(m) if covered > 1 => {
                outs.extend(self.acks.iter().filter(|&&t| t > m).map(|&tag| Out::Ack {
                    tag,
                    multiple: false,
                }));
                outs.push(Out::Ack {
                    tag: m,
                    multiple: true,
                });
            }
            _ => outs.extend(self.acks.iter().map(|&tag| Out::Ack {
                tag,
                multiple: false,
            })),
        }
        self.acks.clear();
    }
}
