//! Full-text search on the PostgreSQL store: the `search_messages` table (migration 2), one row
//! per user or assistant message with text, written in the transaction that appends or imports
//! its entry (so every replica finds what any replica committed, at once), and queried with
//! PostgreSQL's text search.
//!
//! The rules are `pincer_search::text`'s, as for the SQLite index: which lines are messages and
//! their text, what a query means, how words are folded (lowercase, no diacritics: folded here,
//! before PostgreSQL sees them, so no server extension is needed and both indexes agree), and the
//! snippet. A query becomes a `tsquery` built from its parsed terms by SQL functions whose
//! arguments are parameters holding folded words only: nothing typed reaches `to_tsquery`'s
//! syntax.

use crate::{Inner, PgError, PgStore};
use pincer_search::text::{check_query_size, line_message, snippet, title_of, tokens};
use pincer_search::{parse_query, Hit, Term, CANDIDATES, QUERY_TIME_LIMIT};
use tokio_postgres::types::ToSql;

/// Most bytes of folded words a message is found by (a `tsvector` holds at most 1 MB).
const MAX_WORDS_BYTES: usize = 256 * 1024;

/// The folded words of a message's text, as `to_tsvector('simple', …)` is given them.
fn words(text: &str) -> String {
    let mut out = String::new();
    for w in tokens(text) {
        if out.len() + w.len() + 1 > MAX_WORDS_BYTES {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&w);
    }
    out
}

/// Indexes entry `seq` of transcript `transcript` (its JSON `line`) when it is a searchable
/// message, inside the caller's transaction.
pub(crate) async fn index_line(
    tx: &deadpool_postgres::Transaction<'_>,
    transcript: i64,
    seq: i64,
    line: &str,
) -> Result<(), PgError> {
    let Some(found) = line_message(line.as_bytes()) else { return Ok(()) };
    tx.execute(
        "INSERT INTO search_messages (transcript, seq, entry_id, role, ts, text, words) \
         VALUES ($1, $2, $3, $4, $5, $6, to_tsvector('simple', $7)) ON CONFLICT (transcript, seq) DO NOTHING",
        &[&transcript, &seq, &found.entry_id, &found.role, &found.timestamp, &found.text, &words(&found.text)],
    )
    .await?;
    Ok(())
}

/// A query's terms as a `tsquery` expression over parameters `$first…` (returned with their
/// values): each term a phrase of its folded words (`<->`), the last one a prefix for `word*`,
/// every term required (`&&`). `None` when no term has a word.
fn tsquery(terms: &[Term], first: usize) -> Option<(String, Vec<String>)> {
    let mut parts = Vec::new();
    let mut values: Vec<String> = Vec::new();
    let param = |v: String, values: &mut Vec<String>| {
        values.push(v);
        format!("${}", first + values.len() - 1)
    };
    for t in terms {
        let mut words = tokens(&t.text);
        let Some(last) = words.pop() else { continue };
        if !t.prefix {
            words.push(last);
            let p = param(words.join(" "), &mut values);
            parts.push(format!("phraseto_tsquery('simple', {p})"));
            continue;
        }
        // A folded word holds letters and digits only, so quoted it is one lexeme, never syntax.
        let p = param(last, &mut values);
        let prefix = format!("to_tsquery('simple', quote_literal({p}) || ':*')");
        if words.is_empty() {
            parts.push(prefix);
        } else {
            let p = param(words.join(" "), &mut values);
            parts.push(format!("(phraseto_tsquery('simple', {p}) <-> {prefix})"));
        }
    }
    (!parts.is_empty()).then(|| (parts.join(" && "), values))
}

impl PgStore {
    /// The best `limit` hits of a query among the transcripts `files` (names relative to the state
    /// directory; `None`: every live transcript), ranked by `ts_rank` (divided by the log of the
    /// message's length, as BM25 favours short matches) among the newest
    /// [`CANDIDATES`] matches, as the SQLite index ranks by BM25 among its newest.
    ///
    /// Bounded as the SQLite index's: at most [`pincer_search::text::MAX_QUERY_WORDS`] words, and
    /// the query stops at [`QUERY_TIME_LIMIT`] (`statement_timeout`; each search has a pooled
    /// connection of its own, so none waits for another).
    pub fn search(&self, query: &str, files: Option<&[String]>, limit: usize) -> Result<Vec<Hit>, PgError> {
        let terms = parse_query(query);
        check_query_size(&terms).map_err(PgError::Other)?;
        let Some((q, values)) = tsquery(&terms, 2) else {
            return Err(PgError::Other(format!("query {query:?} has no words to search for")));
        };
        let files: Option<Vec<String>> = files.map(<[String]>::to_vec);
        let mut found = self.block(move |inner| async move { inner.search(q, values, files).await })?;
        found.sort_by(|a, b| b.6.total_cmp(&a.6).then(b.0.cmp(&a.0)));
        found.truncate(limit);
        Ok(found
            .into_iter()
            .map(|(_, file, entry_id, role, timestamp, text, score)| Hit {
                file,
                entry_id,
                role,
                timestamp,
                snippet: snippet(&text, &terms),
                score: f64::from(score),
            })
            .collect())
    }

    /// The title search shows for a transcript: its first user message, one line.
    pub fn search_title(&self, file: &str) -> Result<Option<String>, PgError> {
        let file = file.to_owned();
        self.block(move |inner| async move {
            let c = inner.pool.get().await?;
            let row = c
                .query_opt(
                    "SELECT m.text FROM search_messages m JOIN transcripts t ON t.id = m.transcript \
                     WHERE t.file = $1 AND m.role = 'user' ORDER BY m.seq LIMIT 1",
                    &[&file],
                )
                .await?;
            Ok(row.map(|r| title_of(r.get::<_, &str>(0))))
        })
    }

    /// Indexes the messages of transcripts written before search existed (migration 2), from
    /// each one's `indexed_seq` on; appends keep it current from then on. Returns how many
    /// transcripts were caught up.
    pub async fn index_backlog(&self) -> Result<usize, PgError> {
        self.run(|inner| async move { inner.index_backlog().await }).await
    }
}

/// A row of [`Inner::search`]: id, file, entry id, role, timestamp, text, rank.
type Row = (i64, String, String, String, i64, String, f32);

impl Inner {
    async fn search(&self, q: String, values: Vec<String>, files: Option<Vec<String>>) -> Result<Vec<Row>, PgError> {
        let mut c = self.pool.get().await?;
        let filter = match files {
            Some(_) => "t.file = ANY($1)",
            None => "t.file LIKE '%.jsonl' AND $1::text[] IS NULL",
        };
        let sql = format!(
            "WITH q AS (SELECT {q} AS q) \
             SELECT m.id, t.file, m.entry_id, m.role, m.ts, m.text, ts_rank(m.words, q.q, 1) \
             FROM q, search_messages m JOIN transcripts t ON t.id = m.transcript \
             WHERE m.words @@ q.q AND {filter} ORDER BY m.id DESC LIMIT {CANDIDATES}"
        );
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&files];
        params.extend(values.iter().map(|v| v as &(dyn ToSql + Sync)));
        let tx = c.transaction().await?;
        tx.batch_execute(&format!("SET LOCAL statement_timeout = {}", QUERY_TIME_LIMIT.as_millis())).await?;
        let rows = match tx.query(&sql, &params).await {
            Ok(rows) => rows,
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {
                return Err(PgError::Other(format!(
                    "search stopped at its time limit of {} ms; narrow the query (fewer words, more letters before a *)",
                    QUERY_TIME_LIMIT.as_millis()
                )))
            }
            Err(e) => return Err(e.into()),
        };
        tx.commit().await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6))).collect())
    }

    async fn index_backlog(&self) -> Result<usize, PgError> {
        let mut done = 0;
        loop {
            let mut client = self.pool.get().await?;
            let behind: Vec<i64> = client
                .query("SELECT id FROM transcripts WHERE indexed_seq < last_seq ORDER BY id LIMIT 64", &[])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if behind.is_empty() {
                return Ok(done);
            }
            for id in behind {
                let tx = client.transaction().await?;
                let Some(row) =
                    tx.query_opt("SELECT indexed_seq FROM transcripts WHERE id = $1 FOR UPDATE", &[&id]).await?
                else {
                    continue;
                };
                let from: i64 = row.get(0);
                let rows = tx
                    .query(
                        "SELECT seq, line FROM entries WHERE transcript = $1 AND seq > $2 ORDER BY seq",
                        &[&id, &from],
                    )
                    .await?;
                for r in &rows {
                    index_line(&tx, id, r.get(0), r.get(1)).await?;
                }
                tx.execute("UPDATE transcripts SET indexed_seq = last_seq WHERE id = $1", &[&id]).await?;
                tx.commit().await?;
                done += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_become_parameters() {
        let (q, v) = tsquery(&parse_query("Café \"pena PAL\"* x* foo\" OR 1=1 --"), 2).expect("terms");
        assert_eq!(
            q,
            "phraseto_tsquery('simple', $2) && (phraseto_tsquery('simple', $4) <-> to_tsquery('simple', \
             quote_literal($3) || ':*')) && to_tsquery('simple', quote_literal($5) || ':*') && \
             phraseto_tsquery('simple', $6) && phraseto_tsquery('simple', $7)"
        );
        assert_eq!(v, ["cafe", "pal", "pena", "x", "foo", "or 1 1"]);
        assert_eq!(tsquery(&parse_query("-- *"), 2), None);
    }
}
