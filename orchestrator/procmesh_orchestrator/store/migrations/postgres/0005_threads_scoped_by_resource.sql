-- Thread ids are scoped by resource: a thread is (resource_id, thread_id), so two resources using
-- the same thread id have two threads, and no resource can read, squat or block another's. Every
-- message carries its thread's resource (copied from its thread here), so a read of a thread's
-- messages filters on the caller's resource in the same statement. The thread's id column is now
-- `thread_id`: a replica of an older build fails on this schema ("column id does not exist")
-- instead of reading or writing by the old, unscoped id.
ALTER TABLE messages ADD COLUMN resource_id TEXT;
UPDATE messages SET resource_id = threads.resource_id FROM threads WHERE threads.id = messages.thread_id;
ALTER TABLE messages ALTER COLUMN resource_id SET NOT NULL;

ALTER TABLE messages DROP CONSTRAINT messages_thread_id_fkey;
ALTER TABLE messages DROP CONSTRAINT messages_thread_id_id_key;
ALTER TABLE threads DROP CONSTRAINT threads_pkey;
ALTER TABLE threads RENAME COLUMN id TO thread_id;
ALTER TABLE threads ADD PRIMARY KEY (resource_id, thread_id);

ALTER TABLE messages ADD UNIQUE (resource_id, thread_id, id);
ALTER TABLE messages ADD FOREIGN KEY (resource_id, thread_id)
    REFERENCES threads (resource_id, thread_id) ON DELETE CASCADE;

DROP INDEX messages_by_thread;
CREATE INDEX messages_by_thread ON messages (resource_id, thread_id, seq);
