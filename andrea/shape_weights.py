"""Weights of the system-prompt-shape scorer (andrea/shape.py): an L2-regularised logistic
regression over shape.FEATURES, fitted on andrea/labelled/shape_set.txt by `andrea shape fit`,
which rewrites this file. Do not edit by hand."""

FEATURES = (
    'declaration_first',
    'you_are_np',
    'you_are_name',
    'you_are_other',
    'role_imperative',
    'want_you_to',
    'possessive_config',
    'config_labels',
    'third_person_agent',
    'named_agent',
    'frame',
    'meta_user',
    'serve_party',
    'handle_messages',
    'meta_agent',
    'meta_reply',
    'meta_conversation',
    'incoming',
    'conditional_rules',
    'standing_scope',
    'speech_directive_density',
    'imperative_share',
    'modal_density',
    'you_modal_density',
    'you_present_density',
    'refusal_rules',
    'rule_lines',
    'second_person_rate',
    'first_plural_rate',
    'third_person_rate',
    'past_narrative_rate',
    'question_share',
    'opens_with_question',
    'request_question',
    'exclaim_share',
    'social',
    'human_vocative',
    'enjambment',
    'dialogue_share',
    'field_lines',
    'repeated_labels',
    'number_rate',
    'log_words',
    'declared_and_directed',
    'declared_and_interacting',
    'directed_and_interacting',
    'declared_and_agent',
)
WEIGHTS = (
    1.9250937586918362,  # declaration_first
    0.8262264266521536,  # you_are_np
    2.4394195204418856,  # you_are_name
    1.741342840730661,  # you_are_other
    0.024875541984867175,  # role_imperative
    1.6668762543895885,  # want_you_to
    1.2210681177101008,  # possessive_config
    0.6171642382471165,  # config_labels
    1.6718318007334685,  # third_person_agent
    2.342656326176147,  # named_agent
    1.175245340236269,  # frame
    1.0960630363448483,  # meta_user
    1.4188759124155088,  # serve_party
    0.6264003913981381,  # handle_messages
    0.8310880113706142,  # meta_agent
    3.756748787153058,  # meta_reply
    1.9369469704660782,  # meta_conversation
    1.7972116912288085,  # incoming
    1.1019665819579212,  # conditional_rules
    2.6446975570493017,  # standing_scope
    -0.0457807279152067,  # speech_directive_density
    0.10981923948106861,  # imperative_share
    0.11703280708674671,  # modal_density
    0.7383890887395704,  # you_modal_density
    -0.3092191513829612,  # you_present_density
    0.8387462215015313,  # refusal_rules
    0.2012276132051091,  # rule_lines
    -7.789918478401238,  # second_person_rate
    -30.99377643401006,  # first_plural_rate
    -6.763156234061571,  # third_person_rate
    -14.286722940385971,  # past_narrative_rate
    -1.7600271476277092,  # question_share
    -0.9863559115868052,  # opens_with_question
    -0.9325955776389836,  # request_question
    -0.8835569419456358,  # exclaim_share
    -0.8958337801316417,  # social
    -2.7104738235532637,  # human_vocative
    -0.972579368108688,  # enjambment
    -1.3177122662835907,  # dialogue_share
    -0.003206029216412235,  # field_lines
    -0.20401100651403128,  # repeated_labels
    -20.191365602587787,  # number_rate
    -0.21368517642923368,  # log_words
    1.340776445654979,  # declared_and_directed
    0.7623941877168633,  # declared_and_interacting
    1.9430893688146982,  # directed_and_interacting
    1.7221871771937933,  # declared_and_agent
)
INTERCEPT = -2.236957567026583
# probability at which a text is called system-prompt shaped (shape_score() maps it to 0.5)
THRESHOLD = 0.45485095308490575
L2 = 12.0  # the ridge penalty the fit chose

# The set these were fitted on, and cross_validate() on it (held-out precision and recall)
LABELLED_SET_SHA256 = '97358a27e28a532f4882e5125c910a71894de82f5da98f3c8987fdd0e72214ea'
CROSS_VALIDATED = {'method': '5 x 5-fold stratified cross-validation (seed 13)',
 'k': 5,
 'repeats': 5,
 'seed': 13,
 'n': 723,
 'precision': 0.9746,
 'recall': 0.9521,
 'tp': 1609,
 'fp': 42,
 'fn': 81,
 'tn': 1883,
 'rounds': [{'seed': 13,
             'thresholds': [0.6829, 0.387, 0.4099, 0.5888, 0.4539],
             'precision': 0.9729,
             'recall': 0.9556,
             'tp': 323,
             'fp': 9,
             'fn': 15,
             'tn': 376},
            {'seed': 14,
             'thresholds': [0.5367, 0.5199, 0.5017, 0.4202, 0.5025],
             'precision': 0.9759,
             'recall': 0.9586,
             'tp': 324,
             'fp': 8,
             'fn': 14,
             'tn': 377},
            {'seed': 15,
             'thresholds': [0.5748, 0.4162, 0.3571, 0.5167, 0.5535],
             'precision': 0.9728,
             'recall': 0.9527,
             'tp': 322,
             'fp': 9,
             'fn': 16,
             'tn': 376},
            {'seed': 16,
             'thresholds': [0.4944, 0.476, 0.5895, 0.4509, 0.5188],
             'precision': 0.9758,
             'recall': 0.9556,
             'tp': 323,
             'fp': 8,
             'fn': 15,
             'tn': 377},
            {'seed': 17,
             'thresholds': [0.6083, 0.4748, 0.4225, 0.5592, 0.5718],
             'precision': 0.9754,
             'recall': 0.9379,
             'tp': 317,
             'fp': 8,
             'fn': 21,
             'tn': 377}]}
