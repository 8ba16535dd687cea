-- Thread ids are scoped by resource: a thread is (resource_id, thread_id), so two resources using
-- the same thread id have two threads, and no resource can read, squat or block another's. Every
-- message carries its thread's resource, so a read of a thread's messages filters on the caller's
-- resource in the same statement. SQLite cannot change a primary key in place: both tables are
-- rebuilt under new names, the data copied (threads in their rowid order, messages with their seq,
-- each with its thread's resource), the old tables dropped (messages first: nothing references
-- them once the copy is made) and the new ones renamed, which points the foreign key at `threads`.
-- The thread's id column is now `thread_id`: a replica of an older build fails on this schema
-- with "no such column" instead of reading by the old, unscoped id.
CREATE TABLE threads_scoped (
    resource_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (resource_id, thread_id)
);

INSERT INTO threads_scoped (resource_id, thread_id, title, metadata, created_at, updated_at)
SELECT resource_id, id, title, metadata, created_at, updated_at FROM threads ORDER BY rowid;

CREATE TABLE messages_scoped (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    resource_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    id TEXT NOT NULL,
    role TEXT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (resource_id, thread_id, id),
    FOREIGN KEY (resource_id, thread_id) REFERENCES threads_scoped (resource_id, thread_id)
        ON DELETE CASCADE
);

INSERT INTO messages_scoped (seq, resource_id, thread_id, id, role, body)
SELECT m.seq, t.resource_id, m.thread_id, m.id, m.role, m.body
FROM messages AS m JOIN threads AS t ON t.id = m.thread_id ORDER BY m.seq;

-- The sequence goes on from the old table's (never reused, even after deletes).
DELETE FROM sqlite_sequence WHERE name = 'messages_scoped';
INSERT INTO sqlite_sequence (name, seq) SELECT 'messages_scoped', seq FROM sqlite_sequence WHERE name = 'messages';

DROP TABLE messages;
DROP TABLE threads;
ALTER TABLE threads_scoped RENAME TO threads;
ALTER TABLE messages_scoped RENAME TO messages;

CREATE INDEX threads_by_resource ON threads (resource_id, updated_at DESC);
CREATE INDEX messages_by_thread ON messages (resource_id, thread_id, seq);
