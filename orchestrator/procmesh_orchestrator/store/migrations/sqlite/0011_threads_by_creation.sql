-- The memory API lists a resource's threads newest created first by default, a page at a time,
-- ordered and paged by the store: this index serves that order (0001's serves updated_at).
CREATE INDEX threads_by_resource_created ON threads (resource_id, created_at DESC);
