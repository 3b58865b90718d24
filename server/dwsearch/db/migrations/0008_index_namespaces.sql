-- A REST index's namespaces as Upstash keeps them: made by the first upsert into it, kept
-- (with 0 vectors) when reset empties it, gone only when deleted (delete-namespace).
CREATE TABLE dw_index_namespaces (
    model      varchar NOT NULL,
    namespace  varchar NOT NULL,
    PRIMARY KEY (model, namespace)
);
-- The namespaces REST indexes hold today.
INSERT INTO dw_index_namespaces (model, namespace)
    SELECT DISTINCT model, namespace FROM dw_index_documents WHERE namespace LIKE '%' || chr(31) || '%'
    ON CONFLICT DO NOTHING;
