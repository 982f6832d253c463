-- Carillon schema, version 9: manifest sets' ownership labels (docs/manifests.md).
--
-- `carillon apply` manages schedules, task types and tenants from files grouped in named
-- manifest sets. An object applied by a set carries that set's label: one row here, keyed
-- by the object's kind and name. `--prune` deletes only objects labelled with the applying
-- set, so objects made otherwise (API, CLI, import-crontab) or by another set are never
-- pruned. An object has at most one owner (the primary key).
--
-- No foreign keys: a label may outlive its object (a schedule deleted through the API), and
-- the next apply of the set re-creates the object or, pruning, drops the label. A new,
-- empty table: creating it takes no lock on a live ledger's other tables.
CREATE TABLE manifest_labels (
    kind          text NOT NULL CHECK (kind IN ('schedule', 'task_type', 'tenant')),
    name          text NOT NULL,
    manifest_set  text NOT NULL,
    PRIMARY KEY (kind, name)
);

-- An apply reads the objects its set owns: one range of this index.
CREATE INDEX manifest_labels_set_idx ON manifest_labels (manifest_set);
