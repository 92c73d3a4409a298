;;; diffill.el --- Fill-in-the-middle completion from the diffill language server  -*- lexical-binding: t; -*-

;; Copyright (C) 2025 the diffill authors

;; Author: the diffill authors
;; Version: 0.1.0
;; Package-Requires: ((emacs "28.1") (eglot "1.9") (jsonrpc "1.0.14"))
;; Keywords: convenience, languages, tools
;; SPDX-License-Identifier: Apache-2.0

;; This file is not part of GNU Emacs.

;; Licensed under the Apache License, Version 2.0 (the "License");
;; you may not use this file except in compliance with the License.
;; You may obtain a copy of the License at
;;
;;     http://www.apache.org/licenses/LICENSE-2.0
;;
;; Unless required by applicable law or agreed to in writing, software
;; distributed under the License is distributed on an "AS IS" BASIS,
;; WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
;; See the License for the specific language governing permissions and
;; limitations under the License.

;;; Commentary:

;; diffill is a language server (`diffill serve', stdio) that fills the hole at
;; the cursor with a masked-diffusion language model.  This package:
;;
;; - registers `diffill serve' with eglot for `diffill-major-modes', passing
;;   `diffill-server-options' as LSP initializationOptions, so that
;;   `completion-at-point' (M-TAB, or company/corfu) offers its completions;
;; - adds `diffill-inline-mode', a minor mode that shows the server's
;;   textDocument/inlineCompletion answer as ghost text (an overlay) after you
;;   stop typing, since eglot has no inline completion UI of its own.
;;
;; Setup:
;;
;;   (require 'diffill)
;;   (setq diffill-server-options '(:device "cpu"))  ; optional, see below
;;   (diffill-setup)            ; eglot entry + diffill-inline-mode in managed buffers
;;   ;; then M-x eglot in a Python buffer
;;
;; Which buffers: eglot (1.9) gives a buffer one language server, so a mode
;; handed to diffill no longer gets gopls, tsserver, clangd... from eglot.  A
;; language server does more for its buffers than completion (definitions,
;; diagnostics, renames), so by default (`diffill-major-modes' = `auto')
;; `diffill-setup' hands diffill the Python modes and, of the other languages
;; the server checks with a parser (`diffill-language-modes': JavaScript,
;; TypeScript, Go, Rust, Java, C, C++, C#, Ruby, PHP, Lua, shell), only those
;; for which `eglot-server-programs' has no other server that can start: no
;; entry, or its program not found by `executable-find' when `diffill-setup'
;; runs.  There, eglot would start nothing, and diffill's completions are all
;; there is to have.  A list in `diffill-major-modes' is used as it is:
;; '(python-mode python-ts-mode) for Python only, '(prog-mode) for every
;; language (in place of every other eglot server).  `M-x diffill-setup' again
;; decides again (after installing gopls, say).
;;
;; Keys while ghost text is shown (`diffill-inline-mode-map'; they fall
;; through to their usual commands when no ghost text is shown):
;;
;;   TAB      accept the suggestion
;;   M-]      next candidate        M-[   previous candidate
;;   C-g      dismiss
;;
;; Commands: `diffill-toggle' (on/off, pushed to the server with
;; workspace/didChangeConfiguration), `diffill-status' (a few lines: model,
;; device, latency percentiles, drafts accepted, last request; with C-u all of
;; the server's diffill/status in the buffer *diffill-status*),
;; `diffill-inline-trigger' (ask now), `diffill-inline-accept',
;; `diffill-inline-next', `diffill-inline-previous', `diffill-inline-dismiss'.
;;
;; Nothing enters the buffer without an explicit accept: ghost text is an
;; overlay until TAB; RET and other keys act as usual and drop or keep it.
;; A request made while the server still loads its model is answered once the
;; model is ready (the server holds it), so the first ghost text needs no
;; second keystroke.

;;; Code:

(require 'cl-lib)
(require 'eglot)
(require 'jsonrpc)

(defgroup diffill nil
  "Fill-in-the-middle completion from the diffill language server."
  :group 'tools
  :prefix "diffill-")

(defcustom diffill-server-command '("diffill" "serve")
  "Command line that starts the diffill language server on stdio."
  :type '(repeat string))

(defcustom diffill-language-modes
  '((python python-mode python-ts-mode)
    (javascript js-mode js-ts-mode)
    (typescript typescript-mode typescript-ts-mode tsx-ts-mode)
    (go go-mode go-ts-mode)
    (rust rust-mode rust-ts-mode)
    (java java-mode java-ts-mode)
    (c c-mode c-ts-mode)
    (cpp c++-mode c++-ts-mode)
    (csharp csharp-mode csharp-ts-mode)
    (ruby ruby-mode ruby-ts-mode)
    (php php-mode php-ts-mode)
    (lua lua-mode lua-ts-mode)
    (bash sh-mode bash-ts-mode))
  "The languages the diffill server checks with a parser, and their major modes.
Each element is (LANGUAGE MODE...).  When `diffill-major-modes' is `auto',
`diffill-setup' hands a language's modes to diffill when no other eglot server
is available for any of them (Python's always).
See `diffill-default-major-modes'."
  :type '(alist :key-type symbol :value-type (repeat symbol)))

(defcustom diffill-major-modes 'auto
  "Major modes (and modes derived from them) whose buffers eglot hands to diffill.
Eglot runs one server per buffer: a mode listed here no longer gets its usual
language server from eglot.  Hence the default, `auto': when `diffill-setup'
runs, the Python modes, plus the modes of each other language of
`diffill-language-modes' (JavaScript, TypeScript, Go, Rust, Java, C, C++, C#,
Ruby, PHP, Lua, shell) for which `eglot-server-programs' offers no other server
that can start here: its entry is missing, or its program is not found by
`executable-find' (see `diffill-default-major-modes').  Installing gopls later
gives Go back to gopls at the next `diffill-setup'.

A list of modes is used as it is, e.g. \\='(python-mode python-ts-mode) for
Python only, \\='(prog-mode) for every programming language, or
\\='(go-mode go-ts-mode python-mode) to take Go from gopls."
  :type '(choice (const :tag "Python, and the parsed languages with no other server" auto)
                 (repeat symbol)))

(defcustom diffill-server-options nil
  "Server options, a plist with the server's camelCase names.
For example (:modelPath \"/path/to/ckpt\" :device \"cuda\" :latencyBudgetMs 25
:maxTokens 32 :contextTokens 1024 :multiline \"auto\" :numCandidates 3
:enabled t).  Use :json-false for false.  Sent as initializationOptions (under
\"diffill\") and again by `diffill-toggle' and `diffill-configure'."
  :type 'plist)

(defcustom diffill-inline-delay 0.15
  "Seconds without a buffer change before ghost text is requested."
  :type 'number)

(defcustom diffill-inline-auto t
  "Non-nil: `diffill-setup' enables `diffill-inline-mode' in diffill buffers."
  :type 'boolean)

(defvar diffill-inline-answer-functions nil
  "Abnormal hook run in the buffer after each inline completion answer is shown.
Each function gets the list of items (plists) of the answer, possibly empty.")

(defface diffill-ghost-face
  '((t :inherit shadow :slant italic))
  "Face of the ghost text shown by `diffill-inline-mode'.")

;;;; Server registration (eglot)

(defvar diffill-inline-mode)            ; defined by `define-minor-mode' below

(defun diffill--initialization-options (_server)
  "The initializationOptions object sent to the diffill server."
  (list :diffill (or diffill-server-options eglot--{})))

(defun diffill--contact ()
  "The `eglot-server-programs' contact for diffill."
  (append diffill-server-command
          (list :initializationOptions #'diffill--initialization-options)))

(defun diffill--own-entry-p (entry)
  "Non-nil when the `eglot-server-programs' ENTRY is one `diffill-setup' made."
  (let ((contact (cdr entry)))
    (or (equal contact (diffill--contact))
        (and (proper-list-p contact)
             (memq #'diffill--initialization-options contact)
             t))))

(defun diffill--contact-available-p (contact)
  "Non-nil when the eglot CONTACT names a server that can start here.
A function (such as `eglot-alternatives' makes) is called as `eglot-ensure'
calls it, non-interactively: an error means none of its programs is found.
A program (a string first) must be found by `executable-find'; a host and port,
or anything else this cannot judge, counts as available."
  (cond ((functionp contact)
         (condition-case nil (and (funcall contact nil) t) (error nil)))
        ((not (consp contact)) t)
        ((and (symbolp (car contact)) (not (keywordp (car contact))))
         (diffill--contact-available-p (cdr contact))) ; (CLASS . CONTACT)
        ((not (stringp (car contact))) t)
        ((integerp (cadr contact)) t)                  ; (HOST PORT ...)
        (t (and (executable-find (car contact)) t))))

(defun diffill--other-server-p (mode)
  "Non-nil when `eglot-server-programs' has a server for MODE that can start.
Diffill's own entries are skipped.  An entry is for MODE when one of its modes
is MODE or one MODE derives from, as in eglot's own lookup; the first such
entry is the one eglot would use."
  (cl-loop for entry in eglot-server-programs
           ;; MODES: a mode, (MODE :language-id ID), or a list of either
           for key = (car entry)
           for specs = (if (and (consp key) (not (keywordp (cadr key)))) key (list key))
           when (and (not (diffill--own-entry-p entry))
                     (cl-some (lambda (spec)
                                (let ((probe (if (consp spec) (car spec) spec)))
                                  (and (symbolp probe) (provided-mode-derived-p mode probe))))
                              specs))
           return (diffill--contact-available-p (cdr entry))))

(defun diffill-default-major-modes ()
  "The modes `diffill-setup' registers when `diffill-major-modes' is `auto'.
The Python modes always (diffill's first language, its default since 0.1), and
the modes of every other language of `diffill-language-modes' none of whose
modes has another server in `eglot-server-programs' that can start here
\(`diffill--other-server-p'): eglot gives a buffer one server, and a
language server you installed (gopls, tsserver, clangd...) does more for that
buffer than completion, so diffill never takes its place; where there is none,
eglot would start nothing and diffill gives those buffers completions."
  (cl-loop for (lang . modes) in diffill-language-modes
           when (or (eq lang 'python) (not (cl-some #'diffill--other-server-p modes)))
           append modes))

(defun diffill-registered-modes ()
  "The major modes `diffill-setup' hands to diffill now."
  (if (eq diffill-major-modes 'auto) (diffill-default-major-modes) diffill-major-modes))

;;;###autoload
(defun diffill-setup ()
  "Register diffill with eglot and, when `diffill-inline-auto', enable ghost text.
The modes are those of `diffill-major-modes' (`auto': decided now, see
`diffill-default-major-modes')."
  (interactive)
  (setq eglot-server-programs (cl-remove-if #'diffill--own-entry-p eglot-server-programs))
  (setq eglot-server-programs
        (cons (cons (diffill-registered-modes) (diffill--contact)) eglot-server-programs))
  (add-hook 'eglot-managed-mode-hook #'diffill--maybe-enable-inline))

(defun diffill--server ()
  "The eglot server of this buffer when it is diffill, else nil.
A server counts as diffill when its serverInfo name says so or when it offers
inline completions (the only servers this package has any use for)."
  (let ((server (eglot-current-server)))
    (when (and server
               (or (string-match-p "diffill" (or (plist-get (eglot--server-info server) :name) ""))
                   (plist-member (eglot--capabilities server) :inlineCompletionProvider)))
      server)))

(defun diffill--maybe-enable-inline ()
  "Turn `diffill-inline-mode' on or off with eglot management of this buffer."
  (when diffill-inline-auto
    (if (and (bound-and-true-p eglot--managed-mode) (diffill--server))
        (diffill-inline-mode 1)
      (when diffill-inline-mode (diffill-inline-mode -1)))))

(defun diffill-configure (options)
  "Merge the plist OPTIONS into `diffill-server-options', push them to the server."
  (let ((new (copy-sequence diffill-server-options)))
    (cl-loop for (key value) on options by #'cddr
             do (setq new (plist-put new key value)))
    (setq diffill-server-options new))
  (let ((server (diffill--server)))
    (when server
      (jsonrpc-notify server :workspace/didChangeConfiguration
                      (list :settings (list :diffill diffill-server-options))))))

(defun diffill-toggle ()
  "Turn diffill's completions on or off."
  (interactive)
  (let ((on (not (eq (plist-get diffill-server-options :enabled) :json-false))))
    (diffill-configure (list :enabled (if on :json-false t)))
    (unless on (diffill-inline-dismiss))
    (message "diffill: %s" (if on "off" "on"))))

(defun diffill--ms (value)
  "VALUE (milliseconds, a number or nil) as \"12 ms\", or \"-\"."
  (if (numberp value) (format "%d ms" (round value)) "-"))

(defun diffill-status-summary (st)
  "A few lines for people from the diffill/status plist ST: model, device,
state, latency percentiles, drafts accepted and the last request."
  (let* ((err (plist-get st :error))
         (state (cond ((stringp err) (concat "error: " err))
                      ((eq (plist-get st :loaded) t) "loaded")
                      ((eq (plist-get st :loading) t) "loading")
                      (t "not loaded")))
         (off (eq (plist-get (plist-get st :options) :enabled) :json-false))
         (drafts (plist-get st :drafts))
         (last (plist-get st :last_context))
         (lines
          (list (format "diffill %s: %s on %s (%s)%s"
                        (or (plist-get st :version) "")
                        (or (plist-get st :model) "default model")
                        (or (plist-get st :device) "?")
                        state (if off ", off" ""))
                (format "latency p50 %s, p95 %s; %s requests, %s from the typed-ahead cache"
                        (diffill--ms (plist-get st :p50_ms)) (diffill--ms (plist-get st :p95_ms))
                        (or (plist-get st :requests) 0) (or (plist-get st :cache_hits) 0)))))
    (unless (eq (plist-get drafts :enabled) :json-false)
      (setq lines (append lines (list (format "drafts accepted %s of %s offered"
                                              (or (plist-get drafts :accepted) 0)
                                              (or (plist-get drafts :offered) 0))))))
    (when (consp last)
      (setq lines (append lines (list (format "last request: %s, %s model, %s prefix + %s suffix tokens"
                                              (diffill--ms (plist-get st :last_ms))
                                              (diffill--ms (plist-get last :model_ms))
                                              (plist-get last :prefix_tokens)
                                              (plist-get last :suffix_tokens))))))
    (mapconcat #'identity (append lines (list "full status: C-u M-x diffill-status")) "\n")))

(defun diffill-status (&optional full show)
  "Return the server's diffill/status plist; interactively (SHOW) show a summary.
The summary is a few lines: the model and the device, the latency percentiles,
the drafts accepted and the last request.  With a prefix argument FULL, show
all of diffill/status (as JSON) in the buffer *diffill-status* instead."
  (interactive (list current-prefix-arg t))
  (let ((server (or (diffill--server) (user-error "No diffill server in this buffer"))))
    (let ((st (jsonrpc-request server :diffill/status eglot--{})))
      (when show
        (if full
            (with-current-buffer (get-buffer-create "*diffill-status*")
              (let ((inhibit-read-only t))
                (erase-buffer)
                (insert (json-encode st))
                (ignore-errors (json-pretty-print-buffer))
                (goto-char (point-min))
                (special-mode))
              (display-buffer (current-buffer)))
          (message "%s" (diffill-status-summary st))))
      st)))

;;;; Ghost text (textDocument/inlineCompletion)

(defvar-local diffill--items nil "Inline completion items (plists) of the last answer.")
(defvar-local diffill--index 0 "Index in `diffill--items' of the item shown.")
(defvar-local diffill--overlay nil "Overlay showing the ghost text.")
(defvar-local diffill--start nil "Marker at the start of the range the shown item replaces.")
(defvar-local diffill--end nil "Marker at the end of that range (at request time).")
(defvar-local diffill--timer nil "Pending debounce timer.")
(defvar-local diffill--request-tick 0 "Counter identifying the latest request.")

(defun diffill--item-text (item)
  "Insert text of the inline completion ITEM (a string or a StringValue's value)."
  (let ((text (plist-get item :insertText)))
    (if (stringp text) text (or (plist-get text :value) ""))))

(defun diffill--remainder ()
  "Text of the shown item still to be inserted at point, or nil.
What sits between the range start and point must be a prefix of the item
\(typed ahead); the rest is the remainder."
  (let ((item (nth diffill--index diffill--items)))
    (when (and item diffill--start (marker-buffer diffill--start)
               (>= (point) diffill--start))
      (let* ((text (diffill--item-text item))
             (typed (buffer-substring-no-properties diffill--start (point))))
        (when (and (string-prefix-p typed text) (< (length typed) (length text)))
          (substring text (length typed)))))))

(defun diffill-inline-visible-p ()
  "Non-nil when ghost text is shown at point."
  (and diffill--overlay (overlay-buffer diffill--overlay)
       (= (overlay-start diffill--overlay) (point))
       (diffill--remainder)
       t))

(defun diffill-inline-suggestion ()
  "The text that `diffill-inline-accept' would insert now, or nil."
  (and (diffill-inline-visible-p) (diffill--remainder)))

(defun diffill--hide ()
  "Delete the ghost text overlay."
  (when diffill--overlay
    (delete-overlay diffill--overlay)
    (setq diffill--overlay nil)))

(defun diffill--render ()
  "Show the remainder of the current item as ghost text at point."
  (diffill--hide)
  (let ((rest (diffill--remainder)))
    (when rest
      (let ((shown (propertize rest 'face 'diffill-ghost-face))
            (n (length diffill--items)))
        (when (> n 1)
          (setq shown (concat shown (propertize (format " (%d/%d)" (1+ diffill--index) n)
                                                'face 'shadow))))
        ;; The cursor stays before the ghost text.
        (put-text-property 0 1 'cursor t shown)
        (setq diffill--overlay (make-overlay (point) (point) nil nil t))
        (overlay-put diffill--overlay 'diffill t)
        (overlay-put diffill--overlay 'after-string shown)
        (overlay-put diffill--overlay 'priority 1000)))))

(defun diffill--show-item (index)
  "Show item INDEX of `diffill--items'."
  (let* ((item (nth index diffill--items))
         (range (plist-get item :range)))
    (setq diffill--index index)
    (let ((region (if range (eglot--range-region range) (cons (point) (point)))))
      (setq diffill--start (copy-marker (car region))
            diffill--end (copy-marker (cdr region) t)))
    (diffill--render)))

(defun diffill-inline-dismiss ()
  "Hide the ghost text and forget the candidates."
  (interactive)
  (when diffill--timer (cancel-timer diffill--timer) (setq diffill--timer nil))
  (cl-incf diffill--request-tick)
  (setq diffill--items nil diffill--index 0)
  (diffill--hide))

(defun diffill--request (trigger-kind &optional then)
  "Ask for inline completions at point; TRIGGER-KIND 1 = invoked, 2 = automatic.
THEN, if non-nil, is called in the buffer after the answer was shown."
  (let ((server (diffill--server)))
    (when server
      (let* ((buf (current-buffer))
             (tick (cl-incf diffill--request-tick))
             (pos (point))
             (modified (buffer-chars-modified-tick))
             (params (append (eglot--TextDocumentPositionParams)
                             (list :context (list :triggerKind trigger-kind)))))
        ;; eglot sends pending didChange notifications before a request only when asked to.
        (eglot--signal-textDocument/didChange)
        (jsonrpc-async-request
         server :textDocument/inlineCompletion params
         :success-fn
         (lambda (result)
           (when (buffer-live-p buf)
             (with-current-buffer buf
               ;; Drop stale answers: a newer request, an edit, or point moved.
               (when (and (= tick diffill--request-tick)
                          (= modified (buffer-chars-modified-tick))
                          (= pos (point)))
                 (let ((items (if (vectorp result) result (plist-get result :items))))
                   (setq diffill--items
                         (cl-remove-if (lambda (it) (string-empty-p (diffill--item-text it)))
                                       (append items nil))))
                 (if diffill--items
                     (diffill--show-item 0)
                   (diffill--hide))
                 (run-hook-with-args 'diffill-inline-answer-functions diffill--items)
                 (when then (funcall then))))))
         :error-fn #'ignore
         :timeout-fn #'ignore)))))

(defun diffill-inline-trigger ()
  "Ask the server for ghost text at point now."
  (interactive)
  (diffill--request 1))

(defun diffill-inline-accept ()
  "Insert the ghost text: replace the shown item's range with its text."
  (interactive)
  (let ((rest (diffill--remainder))
        (item (nth diffill--index diffill--items)))
    (when (and rest item)
      (let ((text (diffill--item-text item))
            (start (marker-position diffill--start))
            ;; The range may extend past point (e.g. an auto-closed bracket).
            (end (max (point) (marker-position diffill--end))))
        (diffill-inline-dismiss)
        (goto-char start)
        (delete-region start end)
        (insert text)))))

(defun diffill-inline-next (&optional n)
  "Show the Nth next candidate (default 1); ask for several when there is one."
  (interactive "p")
  (let ((n (or n 1)))
    (cl-flet ((step ()
                (let ((count (length diffill--items)))
                  (when (> count 0)
                    (diffill--show-item (mod (+ diffill--index n) count))))))
      (if (> (length diffill--items) 1)
          (step)
        (diffill--request 1 (lambda () (when (> (length diffill--items) 1) (step))))))))

(defun diffill-inline-previous (&optional n)
  "Show the Nth previous candidate (default 1)."
  (interactive "p")
  (diffill-inline-next (- (or n 1))))

(defun diffill--after-change (_beg _end _len)
  "Keep typed-ahead ghost text and schedule a new request."
  (when diffill--timer (cancel-timer diffill--timer))
  (let ((buf (current-buffer)))
    (setq diffill--timer
          (run-with-timer diffill-inline-delay nil
                          (lambda ()
                            (when (buffer-live-p buf)
                              (with-current-buffer buf
                                (setq diffill--timer nil)
                                (when (eq buf (window-buffer (selected-window)))
                                  (diffill--request 2)))))))))

(defun diffill--post-command ()
  "Re-render or drop the ghost text after each command (typing ahead, moving)."
  (when diffill--items
    (if (diffill--remainder)
        (unless (and diffill--overlay (= (overlay-start diffill--overlay) (point)))
          (diffill--render))
      (diffill--hide))))

(defun diffill--when-visible (command)
  "Key binding filter: COMMAND while ghost text is shown, else fall through."
  (when (diffill-inline-visible-p) command))

(defvar diffill-inline-mode-map
  (let ((map (make-sparse-keymap)))
    (dolist (binding '(("TAB" . diffill-inline-accept)
                       ("<tab>" . diffill-inline-accept)
                       ("M-]" . diffill-inline-next)
                       ("M-[" . diffill-inline-previous)
                       ("C-g" . diffill-inline-dismiss)))
      (define-key map (kbd (car binding))
                  `(menu-item "" ,(cdr binding) :filter diffill--when-visible)))
    map)
  "Keys of `diffill-inline-mode', active only while ghost text is shown.")

;;;###autoload
(define-minor-mode diffill-inline-mode
  "Show diffill's inline completions as ghost text (needs an eglot diffill server).
After each change, once `diffill-inline-delay' seconds pass without another,
the server is asked for textDocument/inlineCompletion at point and its answer
is drawn after point.

\\{diffill-inline-mode-map}"
  :lighter " diffill"
  :keymap diffill-inline-mode-map
  (if diffill-inline-mode
      (progn
        (add-hook 'after-change-functions #'diffill--after-change nil t)
        (add-hook 'post-command-hook #'diffill--post-command nil t))
    (remove-hook 'after-change-functions #'diffill--after-change t)
    (remove-hook 'post-command-hook #'diffill--post-command t)
    (diffill-inline-dismiss)))

(provide 'diffill)
;;; diffill.el ends here
