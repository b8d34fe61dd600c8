//! A query's walk down the tree: the runs it passes, and how many of each run's blocks
//! match the query.
//!
//! Owns: [`Walk`] and [`Step`], shared by [`super::KvIndexer::find_matches_with`] (which
//! scores holders along it) and the budget's `touch` (which stamps the path's end).
//! Never: looks at holders or changes the tree; it only follows token hashes.

use super::tree::{BlockTree, Node, NodeId, ROOT};
use crate::ids::LocalBlockHash;

/// One run the walk visits.
#[derive(Clone, Copy, Debug)]
pub(super) struct Step<'a> {
    /// The run.
    pub(super) id: NodeId,
    /// The run itself.
    pub(super) node: &'a Node,
    /// Query blocks matched before this run.
    pub(super) start: usize,
    /// Of the run's blocks, how many lead the rest of the query (all of them, except in
    /// the walk's last step).
    pub(super) matched: usize,
}

/// The runs a query follows from the root: each next run is the child that starts with
/// the next query block, until the query ends, no child matches, or a run matches only
/// in part (that run is the last step).
#[derive(Debug)]
pub(super) struct Walk<'a, 'q> {
    tree: &'a BlockTree,
    query: &'q [LocalBlockHash],
    position: usize,
    /// The run the next step hangs off; `None` once a run matched only in part.
    current: Option<&'a Node>,
}

impl<'a, 'q> Walk<'a, 'q> {
    pub(super) fn new(tree: &'a BlockTree, query: &'q [LocalBlockHash]) -> Self {
        Walk {
            tree,
            query,
            position: 0,
            current: Some(tree.node(ROOT)),
        }
    }
}

impl<'a> Iterator for Walk<'a, '_> {
    type Item = Step<'a>;

    #[inline]
    fn next(&mut self) -> Option<Step<'a>> {
        let first = *self.query.get(self.position)?;
        let id = self.current?.child(first)?;
        let node = self.tree.node(id);
        let start = self.position;
        // The run's tokens hashes are contiguous (8 bytes a block): a long match reads
        // half the memory it would with the sequence hashes between them.
        let matched = node
            .blocks
            .tokens()
            .iter()
            .zip(&self.query[start..])
            .take_while(|(block, tokens)| **block == tokens.get())
            .count();
        self.position += matched;
        self.current = (matched == node.len()).then_some(node);
        Some(Step {
            id,
            node,
            start,
            matched,
        })
    }
}
