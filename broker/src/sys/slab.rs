//! Receive slabs: buffers the kernel writes datagrams into, handed on without a copy and
//! written again once every part handed on is gone.
//!
//! A slab is one allocation of `size` bytes, zeroed once when created. The receive path lends
//! its free part to `recvmmsg`, cuts what arrived off the front ([`RecvSlab::split_to`]: a
//! `BytesMut` sharing the allocation, which quinn-proto decrypts in place and the broker keeps
//! as payload), and retires the slab when too little is left. [`RecvSlab::try_reuse`] makes the
//! whole allocation free again once every part cut off it has been dropped, without zeroing it
//! again: that is the one `unsafe` here.

use bytes::BytesMut;

/// One receive slab (see the module docs).
pub struct RecvSlab {
    /// The part not handed on yet: always initialized, at the end of the allocation.
    buf: BytesMut,
    /// Where the allocation starts.
    base: *const u8,
    /// Its size, all of it initialized when the slab was created.
    size: usize,
}

impl RecvSlab {
    /// A new slab of `size` zeroed bytes.
    pub fn new(size: usize) -> RecvSlab {
        let buf = BytesMut::zeroed(size);
        let base = buf.as_ptr();
        RecvSlab { buf, base, size }
    }

    /// The part not handed on yet (bytes still to be received into).
    pub fn free_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..]
    }

    /// How many bytes are free.
    pub fn free_len(&self) -> usize {
        self.buf.len()
    }

    /// Hands on the first `n` free bytes (what was just received into them).
    pub fn split_to(&mut self, n: usize) -> BytesMut {
        self.buf.split_to(n.min(self.buf.len()))
    }

    /// Makes the whole slab free again if nothing cut off it is still alive. On false the slab
    /// has no free bytes until a later call succeeds.
    pub fn try_reuse(&mut self) -> bool {
        self.buf.clear();
        // `try_reclaim` never allocates: on true the buffer is this slab's own allocation,
        // held by no other handle, starting at the allocation when it reaches `size` bytes.
        if !self.buf.try_reclaim(self.size)
            || self.buf.as_ptr() != self.base
            || self.buf.capacity() < self.size
        {
            return false;
        }
        // SAFETY: the buffer starts at `base`, the allocation `BytesMut::zeroed(size)` made,
        // which stays alive because this slab holds a handle to it, and its capacity is at
        // least `size`: `base..base + size` is that allocation, every byte of it initialized
        // (zeroed at creation and since written only with received or decrypted bytes, never
        // de-initialized). No other handle exists (`try_reclaim` succeeded), so nobody else
        // reads or writes those bytes while this slab hands them out again.
        unsafe { self.buf.set_len(self.size) };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_waits_for_every_part_and_never_touches_a_live_one() {
        let mut slab = RecvSlab::new(64);
        slab.free_mut()[..16].fill(7);
        let kept = slab.split_to(16);
        slab.free_mut()[..48].fill(9);
        let gone = slab.split_to(48);
        assert_eq!(slab.free_len(), 0);
        drop(gone);
        assert!(!slab.try_reuse(), "a part is still alive");
        assert_eq!(slab.free_len(), 0);
        assert_eq!(&kept[..], &[7u8; 16][..]);
        drop(kept);
        assert!(slab.try_reuse());
        assert_eq!(slab.free_len(), 64);
        // The same allocation, its old contents readable (initialized), not zeroed again.
        assert_eq!(slab.free_mut().as_ptr(), slab.base);
        assert_eq!(&slab.free_mut()[..16], &[7u8; 16][..]);
        assert_eq!(&slab.free_mut()[16..], &[9u8; 48][..]);
    }

    #[test]
    fn a_slab_split_in_the_middle_comes_back_whole() {
        let mut slab = RecvSlab::new(100);
        let a = slab.split_to(30);
        assert_eq!(slab.free_len(), 70);
        drop(a);
        assert!(slab.try_reuse());
        assert_eq!(slab.free_len(), 100);
    }
}
