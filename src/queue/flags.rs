//! How one request completes and orders: the flags every post takes, on both data paths.

use mlx5::ctrl::Fence;

/// How one request completes and orders.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PostFlags {
    /// Report success with a completion (errors are always reported).
    pub signaled: bool,
    /// Raise a solicited event at the responder (sends and writes with immediate).
    pub solicited: bool,
    /// Wait for earlier work of this QP before starting.
    pub fence: Fence,
}

impl PostFlags {
    /// A completion on success and on error.
    pub const SIGNALED: PostFlags = PostFlags {
        signaled: true,
        solicited: false,
        fence: Fence::None,
    };
    /// A completion only on error ("suppress success completions").
    pub const UNSIGNALED: PostFlags = PostFlags {
        signaled: false,
        solicited: false,
        fence: Fence::None,
    };

    /// With the solicited-event bit.
    pub const fn solicited(mut self) -> PostFlags {
        self.solicited = true;
        self
    }
    /// With a fence mode (`Fence::SmallAndFence` is verbs' `IBV_SEND_FENCE`).
    pub const fn fence(mut self, fence: Fence) -> PostFlags {
        self.fence = fence;
        self
    }
}

impl Default for PostFlags {
    fn default() -> Self {
        PostFlags::SIGNALED
    }
}
