//! Real servers for integration tests.
#![allow(dead_code)]

pub mod cassandra;
pub mod cli;
pub mod docs;
pub mod in_process;
pub mod kafka;
pub mod own_servers;
pub mod redis_server;
pub mod reference;
