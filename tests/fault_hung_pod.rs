//! Issue 20 fault case (being written).
